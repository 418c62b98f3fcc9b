"""Long-document retrieval for embedding models: LongEmbed's synthetic passkey and needle tasks (Zhu et al. 2024),
accuracy at 1 per length with its standard error, per depth bucket, a JSON file, a plot and a markdown table.

As in LongEmbed, the candidates of a query are all the documents of its length, each document answers exactly
one query, and a model reads what its ``max_seq_length`` lets it (a stock model truncates). Where posswap
differs from LongEmbed: lengths are exact token counts of the first model's tokenizer (LongEmbed caps words at
0.75 per token); every document is queried (LongEmbed queries 50 of its 100), which halves the variance at no
extra encoding; needles sit in depth buckets (LongEmbed: anywhere) so accuracy per depth can be read; the needle
haystack is *Persuasion* and the facts are posswap's own (see :mod:`.retrieval_tasks`).

Scores are cosine similarities. A tie shares the credit: a query whose document ties with ``k - 1`` others at
the top score counts ``1/k``, the expected accuracy of breaking ties at random, so an encoder that gives every
text the same vector scores exactly chance, ``1/documents``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .chunking import BASELINES, best_chunk_scores, chunk_vectors, cosine_scores, mean_vector, split_into_pieces
from .late_chunking import late_chunks_and_documents
from .retrieval_tasks import (
    DEFAULT_HAYSTACK,
    TASKS,
    RetrievalTask,
    build_task,
    haystack_tokens,
    max_documents,
    needles_and_queries,
)
from .retrieval_tasks import shortest_length as _shortest_length

DEFAULT_LENGTHS = (256, 512, 1024, 2048)
DEFAULT_DOCUMENTS = 100  # LongEmbed's candidates per length
DEPTH_BUCKETS = 5
CLI_TASKS = {"passkey-retrieval": "passkey", "needle-retrieval": "needle"}
# Tokens of text one evaluation builds and tokenizes (documents x lengths): about 160 MB of text, an hour of
# encoding on a CPU. A length past a model's limit is legitimate (it is read truncated: how a stock model is
# measured) up to READ_PAST_LIMIT times the most any model reads; past that only a baseline that reads whole
# documents (chunks, late chunks in windows) reads the text, and with one the cost alone bounds the lengths.
MAX_TEXT_TOKENS = 1 << 25
READ_PAST_LIMIT = 16  # the default lengths reach 8 times a stock MiniLM's 256
WHOLE_DOCUMENT_BASELINES = ("chunk-mean", "chunk-max", "late-chunk-max")


@dataclass
class ModelRetrieval:
    limit: int | None  # max_seq_length: tokens the model reads (None: not known)
    accuracy: list[float]  # per length
    stderr: list[float]  # per length: sqrt(p (1 - p) / n)
    by_depth: list[list[float]]  # per length, per depth bucket
    hits: list[list[float]]  # per length, per query (1, 0 or a tie's share): for paired comparisons


@dataclass
class RetrievalResults:
    task: str
    lengths: list[int]
    documents: int
    seed: int
    depth_buckets: int
    settings: dict = field(default_factory=dict)
    models: dict[str, ModelRetrieval] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> RetrievalResults:
        models = {name: ModelRetrieval(**value) for name, value in data["models"].items()}
        return cls(**{**data, "models": models})

    @classmethod
    def load(cls, path: str | os.PathLike) -> RetrievalResults:
        path = Path(path)
        return cls.from_dict(json.loads((path / "retrieval.json" if path.is_dir() else path).read_text()))

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``retrieval.json`` and ``retrieval.png`` into ``folder``, each whole or not at all."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / "retrieval.json", lambda p: p.write_text(json.dumps(self.to_dict(), indent=2) + "\n"))
        write_atomically(folder / "retrieval.png", lambda p: plot_retrieval(self, p))
        return folder / "retrieval.json"

    def table(self) -> str:
        """Markdown: one row per length, one column per model, accuracy at 1 ± its standard error."""
        names = list(self.models)
        lines = [
            "| tokens | " + " | ".join(names) + " |",
            "|---|" + "---|" * len(names),
        ]
        for i, length in enumerate(self.lengths):
            cells = [f"{m.accuracy[i]:.2f} ± {m.stderr[i]:.2f}" for m in self.models.values()]
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
        limits = ", ".join(f"{name} {m.limit}" for name, m in self.models.items())
        lines += [
            "",
            f"{self.task} retrieval: accuracy at 1 ± standard error, {self.documents} documents per length "
            f"(chance {1 / self.documents:.2f}), seed {self.seed}; tokens each model reads: {limits}.",
        ]
        return "\n".join(lines)


def write_atomically(path: Path, write) -> None:
    """``write(staging)`` then one rename onto ``path``: the file appears whole or not at all."""
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix}")
    try:
        write(staging)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def plot_retrieval(results: RetrievalResults, path: Path) -> Path:
    """Accuracy at 1 against length, one line per model, error bars one standard error, chance dotted."""
    from ..evaluation.plots import plt, save_figure

    figure, axes = plt.subplots(figsize=(6, 4))
    for name, result in results.models.items():
        axes.errorbar(results.lengths, result.accuracy, yerr=result.stderr, marker="o", capsize=3, label=name)
    axes.axhline(1 / results.documents, color="grey", linestyle=":", label="chance")
    axes.set_xscale("log", base=2)
    axes.set_xticks(results.lengths, [str(n) for n in results.lengths])
    axes.set_ylim(-0.02, 1.02)
    axes.set_xlabel("document length (tokens)")
    axes.set_ylabel("accuracy at 1")
    axes.set_title(f"{results.task} retrieval, {results.documents} documents per length, seed {results.seed}")
    axes.legend(fontsize=8)
    return save_figure(figure, path)


def check_retrieval_inputs(task: str, lengths, documents: int, batch_size: int, haystack: str | None) -> list[int]:
    """One-line ``ValueError`` naming the argument, before any work. Returns the lengths as a list of ints."""
    from ..data import corpus_files

    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}; got {task!r}.")
    if isinstance(lengths, (str, bytes)) or not lengths:
        raise ValueError(f"lengths must be a non-empty list of token counts such as 256 512 1024; got {lengths!r}.")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths) or len(set(lengths)) < len(lengths):
        raise ValueError(f"lengths must be distinct positive whole numbers of tokens; got {list(lengths)}.")
    if isinstance(documents, bool) or not isinstance(documents, int) or not 2 <= documents <= max_documents(task):
        raise ValueError(
            f"documents must be a whole number from 2 to {max_documents(task)} for the {task} task "
            f"(the candidates of each query); got {documents!r}."
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive whole number; got {batch_size!r}.")
    if documents * sum(lengths) > MAX_TEXT_TOKENS:
        raise ValueError(
            f"lengths: {documents} documents at each of {', '.join(map(str, sorted(lengths)))} tokens are "
            f"{documents * sum(lengths):,} tokens of text to build and encode, over the {MAX_TEXT_TOKENS:,} one "
            "evaluation takes: give shorter lengths or fewer documents."
        )
    if haystack is not None and haystack != "filler" and haystack not in corpus_files():
        raise ValueError(
            f"haystack must be 'filler' or an embedded document ({', '.join(corpus_files())}); got {haystack!r}."
        )
    return sorted(lengths)


def check_lengths_read(models: dict[str, Any], baselines, lengths, name: str = "lengths") -> None:
    """One line naming ``name`` (the argument or flag) before any text is built, where the longest length is over
    :data:`READ_PAST_LIMIT` times the most any model reads of a document (its ``max_seq_length``) and no baseline
    reads whole documents. With such a baseline, or a model whose limit is not known, the cost rule alone holds."""
    if any(b in WHOLE_DOCUMENT_BASELINES for b in baselines):
        return
    limits = {n: getattr(m, "max_seq_length", None) for n, m in models.items()}
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in limits.values()):
        return
    reader, reach = max(limits.items(), key=lambda item: item[1])
    if max(lengths) > READ_PAST_LIMIT * reach:
        raise ValueError(
            f"{name}: {max(lengths)} tokens is over {READ_PAST_LIMIT} times the most any model reads of a document "
            f"({reach} tokens, the max_seq_length of {reader}), so the text past that would be built for no reader; "
            f"give lengths up to {READ_PAST_LIMIT * reach}, or add a baseline that reads whole documents "
            f"({', '.join(WHOLE_DOCUMENT_BASELINES)})."
        )


def load_tokenizer(models: dict[str, Any], tokenizer: Any = None):
    """``tokenizer`` (a tokenizer, or a name or folder for AutoTokenizer), else the first model's."""
    if tokenizer is None:
        first = next(iter(models.values()))
        tokenizer = getattr(first, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(
                f"The first model ({next(iter(models))}) has no .tokenizer to measure document lengths with; pass tokenizer=."
            )
    if isinstance(tokenizer, (str, os.PathLike)):
        from transformers import AutoTokenizer

        from ..loading import resolve_model_id

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_id(tokenizer))
    return tokenizer


def build_tasks(task: str, tokenizer, lengths, documents: int, seed: int, haystack=None) -> list[RetrievalTask]:
    """The documents of every length, built once so that every model reads the same ones."""
    needles, _ = needles_and_queries(task, documents, seed)
    shortest = _shortest_length(tokenizer, needles, DEPTH_BUCKETS)
    if min(lengths) < shortest:
        raise ValueError(
            f"lengths: {min(lengths)} tokens cannot hold the {task} needle and a haystack; the shortest length for "
            f"this tokenizer is {shortest}."
        )
    available = haystack_tokens(tokenizer, haystack or DEFAULT_HAYSTACK[task])
    if available is not None and max(lengths) > available:
        raise ValueError(
            f"lengths: {max(lengths)} tokens is longer than the {haystack or DEFAULT_HAYSTACK[task]} haystack "
            f"({available} tokens of this tokenizer), whose text would repeat: give lengths up to {available}, or "
            "a longer haystack."
        )
    return [build_task(task, tokenizer, n, documents, seed, haystack, DEPTH_BUCKETS) for n in lengths]


def evaluate_retrieval(
    models: dict[str, Any],
    task: str = "passkey",
    lengths=DEFAULT_LENGTHS,
    documents: int = DEFAULT_DOCUMENTS,
    seed: int = 0,
    batch_size: int = 8,
    progress: bool = True,
    tokenizer: Any = None,
    haystack: str | None = None,
    baselines=(),
) -> RetrievalResults:
    """Accuracy at 1 of each model (a ``SentenceTransformer``, or anything with its ``encode``) at each length.

    ``lengths`` are tokens of ``tokenizer`` (default: the first model's), special tokens counted; ``documents``
    per length are the candidates of each query and each answers one query. ``haystack`` replaces the task's
    own ('filler' for passkey, 'persuasion' for needle) with 'filler' or an embedded document.

    ``baselines`` (of :data:`~posswap.embeddings.chunking.BASELINES`) add columns, with chunks of the first model's
    limit (its ``max_seq_length``): ``chunk-mean`` and ``chunk-max`` of the first model (the stock one: every chunk
    embedded alone; one mean vector, or a document scoring its best chunk), ``late-chunk-max`` of every other model
    that reads further (:func:`posswap.late_chunks`; a document scores its best chunk).
    """
    lengths = check_retrieval_inputs(task, lengths, documents, batch_size, haystack)
    if not isinstance(models, dict) or not models:
        raise ValueError("models must be a non-empty dict of name -> SentenceTransformer (or an object with .encode).")
    for name, model in models.items():
        if not callable(getattr(model, "encode", None)):
            raise ValueError(f"models[{name!r}] has no encode method; give a SentenceTransformer or an encoder.")
    columns = baseline_columns(models, baselines)
    check_lengths_read(models, baselines, lengths)
    label = _tokenizer_label(models, tokenizer)
    tokenizer = load_tokenizer(models, tokenizer)
    tasks = build_tasks(task, tokenizer, lengths, documents, seed, haystack)
    results = RetrievalResults(task, lengths, documents, seed, DEPTH_BUCKETS, _settings(tasks, label, haystack))
    steps = tqdm(total=(len(models) + len(columns)) * len(tasks), desc=f"{task} retrieval", disable=not progress)
    vectors = Vectors(batch_size, {id(models[n]): c for n, kind, c in columns.values() if kind == "late-chunk-max"})
    for name, model in models.items():
        results.models[name] = _evaluate_model(model, tasks, vectors, steps, name)
    for column, (name, kind, chunk) in columns.items():
        results.models[column] = _evaluate_baseline(models[name], kind, chunk, tasks, vectors, steps, column)
    steps.close()
    return results


def check_baseline_names(baselines) -> None:
    if isinstance(baselines, str) or any(b not in BASELINES for b in baselines) or len(set(baselines)) < len(baselines):
        raise ValueError(f"baselines must be distinct names of {', '.join(BASELINES)}; got {list(baselines)!r}.")


def baseline_columns(models: dict[str, Any], baselines) -> dict[str, tuple[str, str, int]]:
    """Column name -> (model, baseline, chunk tokens), after one-line checks: ``minilm chunk-max@256``."""
    check_baseline_names(baselines)
    if not baselines:
        return {}
    first, stock = next(iter(models.items()))
    chunk = getattr(stock, "max_seq_length", None)
    if not isinstance(chunk, int) or getattr(stock, "tokenizer", None) is None:
        raise ValueError(
            f"baselines chunk documents at the first model's max_seq_length with its tokenizer, and {first} has "
            "no such limit or tokenizer: put a sentence-transformers model first."
        )
    columns = {f"{first} {kind}@{chunk}": (first, kind, chunk) for kind in baselines if kind != "late-chunk-max"}
    if "late-chunk-max" in baselines:
        longer = [n for n, m in list(models.items())[1:] if (getattr(m, "max_seq_length", None) or 0) > chunk]
        if not longer:
            raise ValueError(
                f"late-chunk-max needs a model that reads more than the first model's {chunk} tokens after it; "
                "give a patched model too."
            )
        columns |= {f"{name} late-chunk-max@{chunk}": (name, "late-chunk-max", chunk) for name in longer}
    return columns


def _tokenizer_label(models: dict[str, Any], tokenizer: Any) -> str:
    """What measured the lengths, without this machine's paths: "the tokenizer of MODEL", a name, or a class."""
    if tokenizer is None:
        return f"the tokenizer of {next(iter(models))}"
    return str(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else type(tokenizer).__name__


def _settings(tasks: list[RetrievalTask], tokenizer: str, haystack: str | None) -> dict:
    first = tasks[0]
    return {
        "tokenizer": tokenizer,
        "haystack": haystack or DEFAULT_HAYSTACK[first.task],
        "example_needle": first.needles[0],
        "example_query": first.queries[0],
        "metric": "accuracy at 1 (cosine similarity; a tie of k at the top counts 1/k)",
        "fingerprints": {str(t.length): t.fingerprint() for t in tasks},
        "depths": {str(t.length): [round(d, 4) for d in t.depths] for t in tasks},
    }


class Vectors:
    """Each model's vectors of each task's texts, computed once within one evaluation: a baseline column reuses its
    model's query vectors, and chunk-mean and chunk-max the same chunk vectors. A model with late chunks
    (``late_chunk_of``: its id -> their chunk tokens) reads each document once for them and its one vector."""

    def __init__(self, batch_size: int, late_chunk_of: dict[int, int] | None = None):
        self.batch_size, self.memo, self.late_chunk_of = batch_size, {}, late_chunk_of or {}

    def __call__(self, model, task: RetrievalTask, kind: str, chunk: int = 0):
        """``kind``: queries, documents, chunks (each chunk embedded alone) or late (late chunks)."""
        key = _key(model, task, kind, chunk)
        if kind == "documents" and id(model) in self.late_chunk_of:
            self(model, task, "late", self.late_chunk_of[id(model)])  # leaves the documents where it read them whole
        if key not in self.memo:
            self.memo[key] = self._compute(model, task, kind, chunk)
        return self.memo[key]

    def _compute(self, model, task: RetrievalTask, kind: str, chunk: int):
        if kind == "chunks":
            return chunk_vectors(model, task.documents, chunk, self.batch_size)
        if kind == "late":  # the spans the stock chunks have, each pooled in the whole document (or a window)
            pieces = [split_into_pieces(model.tokenizer, text, chunk) for text in task.documents]
            late, documents = late_chunks_and_documents(
                model, task.documents, batch_size=self.batch_size, chunks=pieces, long_documents="windows"
            )
            if all(d is not None for d in documents):
                self.memo[_key(model, task, "documents")] = torch.stack(documents)
            return late
        return _encode(model, task.queries if kind == "queries" else task.documents, self.batch_size)


def _key(model, task: RetrievalTask, kind: str, chunk: int = 0) -> tuple:
    return (id(model), task.length, kind, chunk)  # the models outlive the evaluation: ids stay theirs


def _evaluate_model(model, tasks: list[RetrievalTask], vectors: Vectors, steps, name: str) -> ModelRetrieval:
    def score(task: RetrievalTask) -> torch.Tensor:
        return cosine_scores(vectors(model, task, "queries"), vectors(model, task, "documents"))

    return _scored(score, getattr(model, "max_seq_length", None), tasks, steps, name)


def _evaluate_baseline(model, kind: str, chunk: int, tasks, vectors: Vectors, steps, name: str) -> ModelRetrieval:
    """``kind`` of :data:`BASELINES` for ``model`` with chunks of ``chunk`` tokens."""

    def score(task: RetrievalTask) -> torch.Tensor:
        queries = vectors(model, task, "queries")
        if kind == "late-chunk-max":
            return best_chunk_scores(queries, vectors(model, task, "late", chunk))
        chunks = vectors(model, task, "chunks", chunk)
        if kind == "chunk-max":
            return best_chunk_scores(queries, chunks)
        return cosine_scores(queries, torch.stack([mean_vector(c) for c in chunks]))

    limit = getattr(model, "max_seq_length", None) if kind == "late-chunk-max" else chunk
    return _scored(score, limit, tasks, steps, name)


def _scored(score, limit: int | None, tasks: list[RetrievalTask], steps, name: str) -> ModelRetrieval:
    result = ModelRetrieval(limit, [], [], [], [])
    for task in tasks:
        steps.set_postfix_str(f"{name} at {task.length}")
        hits = hits_from_scores(score(task))
        p = sum(hits) / len(hits)
        result.accuracy.append(p)
        result.stderr.append(math.sqrt(p * (1 - p) / len(hits)))
        result.by_depth.append(_by_bucket(hits, task.buckets, DEPTH_BUCKETS))
        result.hits.append(hits)
        steps.update()
    return result


def _encode(model, texts: list[str], batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        vectors = model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
    return torch.as_tensor(vectors).detach().float().cpu()


def retrieval_hits(queries: torch.Tensor, documents: torch.Tensor) -> list[float]:
    """Per query ``i`` (answered by document ``i``): 1 when its document scores highest, ``1/k`` when it ties
    with ``k - 1`` others at the top, else 0. Scores are cosine similarities."""
    return hits_from_scores(cosine_scores(queries, documents))


def hits_from_scores(scores: torch.Tensor) -> list[float]:
    """:func:`retrieval_hits` from a (queries, documents) score matrix."""
    top = scores.max(dim=1, keepdim=True).values
    tied = scores == top
    gold = tied[torch.arange(len(scores)), torch.arange(len(scores))]
    return (gold.float() / tied.sum(dim=1).float()).tolist()


def _by_bucket(hits: list[float], buckets: list[int], count: int) -> list[float | None]:
    sums, sizes = [0.0] * count, [0] * count
    for hit, bucket in zip(hits, buckets):
        sums[bucket] += hit
        sizes[bucket] += 1
    return [s / n if n else None for s, n in zip(sums, sizes)]  # None: no document in that bucket


def load_embedding_model(name_or_path: str, device: str | None = None):
    """A sentence-transformers model by Hub id, folder or ``posswap:minilm`` (patched ones through
    :func:`posswap.from_pretrained`); a checkpoint that is not a sentence-transformers model is refused."""
    from ..loading import from_pretrained, resolve_model_id
    from ..sentence_models import transformer_folder

    if transformer_folder(resolve_model_id(name_or_path)) is None:
        raise ValueError(
            f"{name_or_path} is not a sentence-transformers model (no modules.json): retrieval embeds texts, "
            "so give an embedding model such as posswap:minilm or a folder posswap patch wrote from one."
        )
    model = from_pretrained(name_or_path, **({"device": device} if device else {}))
    return model.eval()


def short_model_names(models: list[str]) -> dict[str, str]:
    """Columns named by a folder's last part (``out/minilm-copy-2048`` -> ``minilm-copy-2048``) where unambiguous."""
    short = [Path(m).name if Path(m).exists() else m.removeprefix("posswap:") for m in models]
    return dict(zip(short if len(set(short)) == len(short) else models, models))
