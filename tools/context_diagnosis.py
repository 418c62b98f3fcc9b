"""Where a model's late chunks put the question's first hit on the context task: the fact's chunk, its own document's
naming chunk or another chunk of it, or another document's fact chunk (same question or another) or other chunk.

    python tools/context_diagnosis.py MODEL --length 2048 --documents 32              # the evaluation's templates
    python tools/context_diagnosis.py MODEL --length 2048 --documents 32 --training   # the recipe's own
    python tools/context_diagnosis.py MODEL --length 1024 --documents 48 --window 512  # read in 512-token windows
    python tools/context_diagnosis.py MODEL --length 2048 --documents 48 --shift       # which part costs
    python tools/context_diagnosis.py MODEL --length 2048 --documents 48 --band 256    # attention within 256 tokens

``--out FILE.json`` also writes the lines' figures (each line's share of first hits by where they land).

A miss inside the document (naming chunk) says the chunk lost its own words to the context; a miss in another
document's fact chunk for the same question says the chunk does not carry its subject. On the recipe's templates
against the evaluation's: how much of a score is what the recipe learned by heart. Task seed 5 (the README's
figures use seed 0). The last line: the fact's chunk first by the distance from its subject's naming chunk, in
chunks (``--window``: each chunk pooled in a window of that many tokens, as a model that reads no further would).
``--band W``: each token attends only to tokens at most W away (the whole document still read at its positions):
with ``--window 2W``'s figure, whether a model loses a nearby fact to the number of tokens it attends to or to the
positions it reads them at. ``--shift``: the fact's chunk first for documents that mix the evaluation's parts (names, questions and facts,
introductions and headings, haystacks) with the recipe's, one line each: which part of the distance between the
recipe's templates and the evaluation's costs the most. The recipe's haystacks are the texts the run cut its own
context documents from: ``embedding.context_haystacks`` in the run folder's ``recipe.json`` (the model folder's
parent, as ``posswap train`` writes it), else the recipe's novels.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from posswap.embeddings.context_retrieval import DISTANCE_BUCKETS, distance_bucket
from posswap.embeddings.context_task import EVALUATION, build_context_task, max_context_documents
from posswap.embeddings.late_chunking import late_chunks
from posswap.embeddings.training.context import TRAINING, training_templates
from posswap.loading import load_sentence_transformer
from posswap.training.run_folder import RECIPE_JSON

TASK_SEED, CHUNK_TOKENS = 5, 128  # the README's figures use task seed 0: these documents are others


def first_hits(model, task) -> tuple[collections.Counter, dict[str, list[bool]]]:
    """Where each question's first hit lands, counted; and per distance bucket, whether it was the fact's chunk."""
    with torch.no_grad():
        vectors = late_chunks(model, task.documents, batch_size=8, chunks=task.chunks, long_documents="windows")
        queries = torch.as_tensor(model.encode([q.query for q in task.queries], convert_to_tensor=True)).float()
    owner = [(d, c) for d, v in enumerate(vectors) for c in range(len(v))]
    chunks = F.normalize(torch.cat([torch.as_tensor(v) for v in vectors]).float(), dim=-1)
    scores = F.normalize(queries, dim=-1) @ chunks.T
    facts = {(q.document, q.chunk): q.relation for q in task.queries}
    found, by_distance = collections.Counter(), {}
    for i, query in enumerate(task.queries):
        d, c = owner[int(scores[i].argmax())]
        by_distance.setdefault(distance_bucket(query.distance), []).append((d, c) == (query.document, query.chunk))
        if (d, c) == (query.document, query.chunk):
            found["the fact's chunk"] += 1
        elif d == query.document:
            where = "naming chunk" if c == task.naming_chunks[d] else "other fact" if (d, c) in facts else "other chunk"
            found[f"own document: {where}"] += 1
        else:
            where = "same question" if facts.get((d, c)) == query.relation else "fact" if (d, c) in facts else "chunk"
            found[f"another document: {where}"] += 1
    return found, by_distance


def banded_sdpa(width: int):
    """transformers' SDPA attention with every key further than ``width`` tokens from its query masked out."""

    def attention(module, query, key, value, attention_mask, **kwargs):
        distance = torch.arange(query.shape[-2])[:, None] - torch.arange(key.shape[-2])[None, :]
        far = distance.abs() > width
        if attention_mask is None:
            mask = ~far
        elif attention_mask.dtype == torch.bool:
            mask = attention_mask & ~far
        else:
            mask = attention_mask + torch.zeros(far.shape, dtype=query.dtype).masked_fill(far, float("-inf"))
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)

    return attention


def run_haystacks(model_dir: Path) -> tuple[str, ...]:
    """The texts the model's run cut its context documents from: ``embedding.context_haystacks`` of the run
    folder's ``recipe.json`` (the model folder's parent), else TRAINING's novels (the recipe's default, and a model
    that left its run folder)."""
    recipe = Path(model_dir).parent / RECIPE_JSON
    if not recipe.is_file():
        return TRAINING.haystacks
    try:
        chosen = json.loads(recipe.read_text()).get("embedding", {}).get("context_haystacks")
    except (json.JSONDecodeError, AttributeError):
        raise SystemExit(
            f"{recipe} is not a run's resolved recipe (a JSON object): give the model folder posswap train wrote "
            "(RUN/model), or copy the model out of that folder to read it with the recipe's novels."
        ) from None
    return training_templates(chosen).haystacks


def shifted_templates(ours=TRAINING):
    """(label, templates): the recipe's (``ours``: :func:`training_templates` of the run's texts), the evaluation's,
    and mixes of the two, one part at a time. With the recipe's questions each document draws two of its kind's, so
    fewer documents answer the same question than with the evaluation's (two a kind, asked of every document): a mix
    with them is if anything easier."""
    theirs = EVALUATION
    names = {"words": theirs.words, "name": theirs.name}
    return [
        ("recipe's templates and haystacks", ours),
        ("recipe's, evaluation's haystacks", dataclasses.replace(ours, haystacks=theirs.haystacks)),
        ("recipe's, evaluation's names", dataclasses.replace(ours, **names)),
        ("recipe's, evaluation's questions", dataclasses.replace(ours, relations=theirs.relations)),
        ("recipe's, evaluation's introductions", dataclasses.replace(ours, intro=theirs.intro)),
        ("evaluation's, recipe's haystacks", dataclasses.replace(theirs, haystacks=ours.haystacks)),
        ("evaluation's, recipe's questions", dataclasses.replace(theirs, relations=ours.relations)),
        ("evaluation's templates and haystacks", theirs),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--documents", type=int, default=32)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--training", action="store_true", help="the recipe's templates, not the evaluation's")
    which.add_argument("--shift", action="store_true", help="the evaluation's parts mixed with the recipe's")
    parser.add_argument("--window", type=int, help="read each document in windows of this many tokens")
    parser.add_argument("--band", type=int, help="attend only to tokens at most this many tokens away")
    parser.add_argument("--out", type=Path, help="also write each line's figures to this JSON file")
    args = parser.parse_args(argv)
    haystacks = run_haystacks(Path(args.model))
    ours = training_templates(haystacks)
    if args.shift:
        runs = shifted_templates(ours)
    else:
        runs = [("", ours if args.training else EVALUATION)]
    most = min(max_context_documents(templates) for _, templates in runs)
    if not 1 <= args.documents <= most:
        parser.error(f"--documents must be 1 to {most} (the subjects' names run out), got {args.documents}.")
    if args.window is not None and args.window < CHUNK_TOKENS:
        parser.error(f"--window must hold a chunk of {CHUNK_TOKENS} tokens, got {args.window}.")
    if args.band is not None and args.band < 1:
        parser.error(f"--band must be 1 token or more, got {args.band}.")
    if args.length < 3 * CHUNK_TOKENS:
        parser.error(f"--length must hold three chunks of {CHUNK_TOKENS} tokens, got {args.length}.")
    if args.out is not None and (args.out.suffix != ".json" or not args.out.parent.is_dir()):
        parser.error(f"--out must be a .json file in a folder that exists, got {args.out}.")
    model = load_sentence_transformer(args.model, device="cpu")
    if model is None:
        parser.error(
            f"MODEL {args.model} is not a sentence-transformers folder (no modules.json): give the model's "
            "own folder, e.g. out/minilm-late-2k/model."
        )
    if args.window:
        model.max_seq_length = args.window
    if args.band:
        AttentionInterface.register("posswap_diagnosis_band", banded_sdpa(args.band))
        model[0].auto_model.set_attn_implementation("posswap_diagnosis_band")
    if args.shift or args.training:
        print(f"The recipe's haystacks: {', '.join(haystacks)}.", flush=True)
    lines = []
    for label, templates in runs:
        task = build_context_task(model.tokenizer, args.length, args.documents, TASK_SEED, CHUNK_TOKENS, templates)
        found, by_distance = first_hits(model, task)
        total = sum(found.values())
        lines.append({"label": label, "queries": total, "first_hits": {k: v / total for k, v in found.items()}})
        if args.shift:
            share = found["the fact's chunk"] / total
            print(f"{label:40s} {share:.2f}", flush=True)
            continue
        for where, count in found.most_common():
            print(f"{where:32s} {count / total:.2f}")
        buckets = [distance_bucket(low) for low, _ in DISTANCE_BUCKETS if distance_bucket(low) in by_distance]
        print("by distance: " + ", ".join(f"{b}: {sum(by_distance[b]) / len(by_distance[b]):.2f}" for b in buckets))
    if args.out is not None:
        write_lines(args, lines, sys.argv[1:] if argv is None else argv, haystacks)


def write_lines(args, lines: list[dict], argv: list[str], haystacks: tuple[str, ...]) -> None:
    """The lines printed, as JSON: each line's share of first hits by where they land (the fact's chunk's is the
    line's figure), with the model, the documents and the command that made them."""
    record = {
        "model": args.model,
        "length": args.length,
        "documents": args.documents,
        "task_seed": TASK_SEED,
        "window": args.window,
        "band": args.band,
        "recipe_haystacks": list(haystacks),
        "lines": lines,
        "command": " ".join(["python", "tools/context_diagnosis.py", *argv]),
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"Wrote {args.out}.")


if __name__ == "__main__":
    main()
