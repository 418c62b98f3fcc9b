"""``posswap eval --task passkey-retrieval|needle-retrieval|[natural-]context-retrieval``: the long-document retrieval
tasks for sentence-transformers models, run from the command line (the library functions are in
``posswap.embeddings.retrieval`` and ``posswap.embeddings.context_retrieval``)."""

from __future__ import annotations

from pathlib import Path

from ..embeddings.context_retrieval import (
    DEFAULT_CHUNK_TOKENS,
    DEFAULT_CONTEXT_LENGTHS,
    check_context_inputs,
    evaluate_context,
)
from ..embeddings.retrieval import (
    CLI_TASKS,
    DEFAULT_LENGTHS,
    check_baseline_names,
    check_lengths_read,
    check_retrieval_inputs,
    evaluate_retrieval,
    load_embedding_model,
    short_model_names,
)
from ..evaluation.stream import resolve_device
from ..files import check_output_dir
from ..loading import resolve_model_id
from .model_sources import check_model_found


def run_retrieval_command(args) -> None:
    """``posswap eval MODEL ... --task passkey-retrieval|needle-retrieval``: load each MODEL as a
    sentence-transformers model, evaluate, write retrieval.json and retrieval.png to ``--out``, print the table."""
    task = CLI_TASKS[args.task]
    lengths = args.lengths or list(DEFAULT_LENGTHS)  # ints: the parser's list flag checked them
    documents, batch_size = args.documents, args.batch_size  # as given: a 0 is refused below, never replaced
    baselines = args.baselines or []
    check_retrieval_inputs(task, lengths, documents, batch_size, args.haystack)  # before any model loads
    check_baseline_names(baselines)
    check_output_dir(args.out)
    models = _embedding_models(args, lengths)
    results = evaluate_retrieval(
        models,
        task,
        lengths,
        documents,
        seed=args.seed,
        batch_size=batch_size,
        tokenizer=args.tokenizer,
        haystack=args.haystack,
        baselines=baselines,
    )
    results.save(args.out)
    print(results.table())
    print(f"Wrote {Path(args.out) / 'retrieval.json'} and retrieval.png.")


def run_context_command(args) -> None:
    """``posswap eval MODEL ... --task context-retrieval|natural-context-retrieval``: every MODEL as a
    sentence-transformers model, the task at ``--lengths``, context.json in ``--out``, the tables printed."""
    lengths = args.lengths or list(DEFAULT_CONTEXT_LENGTHS)
    chunk_tokens = DEFAULT_CHUNK_TOKENS if args.chunk_tokens is None else args.chunk_tokens
    check_context_inputs(lengths, args.documents, chunk_tokens, args.batch_size, args.task)  # before any model loads
    if args.haystack is not None:
        raise ValueError(
            "--haystack: the context task reads its own two held-out haystacks; leave it out."
            if args.task == "context-retrieval"
            else "--haystack: the natural-reference task reads held-out Persuasion only; leave it out."
        )
    check_output_dir(args.out)
    models = _embedding_models(args, lengths)
    results = evaluate_context(
        models,
        lengths,
        args.documents,
        args.seed,
        chunk_tokens,
        args.batch_size,
        args.baselines or None,
        task=args.task,
    )
    results.save(args.out)
    for metric in ("accuracy", "fact_accuracy"):
        print(results.table(metric), end="\n\n")
    print(f"Wrote {Path(args.out) / 'context.json'}.")


def _embedding_models(args, lengths: list[int]) -> dict:
    """Column name -> each MODEL loaded as a sentence-transformers model; a bare name found nowhere is one line,
    before any model loads. Then every task's one rule on ``--lengths`` (:func:`check_lengths_read`): a length far
    past what every model reads is refused before any document is built, unless a baseline named in
    ``--baselines`` reads whole documents (the context task's default chunk rows do not count)."""
    for source in args.models:
        check_model_found(resolve_model_id(source))
    device = resolve_device(args.device)
    models = {name: load_embedding_model(source, device) for name, source in short_model_names(args.models).items()}
    check_lengths_read(models, args.baselines or [], lengths, "--lengths")
    return models
