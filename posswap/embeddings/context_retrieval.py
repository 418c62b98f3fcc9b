"""Contextual chunk retrieval: does a chunk's vector know what its document says? (:mod:`.context_task`)

Every row scores the same chunks (the task's spans) of every document of one length:

- ``MODEL chunks`` (the first model's ``chunk-max``): each chunk embedded alone, what a vector database user does;
- ``MODEL late chunks`` (``late-chunk-max``, each later model that reads further): the chunk's tokens pooled in
  the whole document (:func:`posswap.late_chunks`; a document longer than the model reads in overlapping windows);
- ``MODEL``: one vector per document (every chunk of it gets that vector: a tie among them shares the credit).

Scores, per length with their standard errors over queries: accuracy at 1 among every chunk of every document
(``accuracy``), nDCG@10 there (one relevant chunk; ties count in expectation), accuracy at 1 among the chunks that
answer the query's question in every document (``fact_accuracy``: a model blind to context is at chance, one in the
documents of that kind), and the fact's document first by its best chunk (``document_accuracy``).

``task="natural-context-retrieval"`` scores the natural-reference task (:mod:`.natural_context`: a real passage of
*Persuasion* in two copies, two people's invented names swapped) the same way: its fact accuracy is between the two
copies' fact chunks (chance one in two), also on the facts whose nearest preceding name is the other person's.
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

from ..config import check_choice
from .chunking import BASELINES, cosine_scores, mean_vector
from .context_task import (
    HAYSTACKS,
    KINDS,
    QUESTIONS_PER_DOCUMENT,
    TEMPLATES,
    ContextTask,
    build_context_task,
    haystack_of,
    max_context_documents,
)
from .late_chunking import late_chunks_and_documents
from .natural_context import COPIES, EVALUATION_SOURCE, build_natural_task
from .retrieval import check_lengths_read

DEFAULT_CONTEXT_LENGTHS = (512, 1024, 2048, 4096)
DEFAULT_CHUNK_TOKENS = 128
DISTANCE_BUCKETS = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 1 << 30))
# posswap eval's --task -> the task's documents: invented subjects (context_task) or renamed real passages
CONTEXT_TASKS = ("context-retrieval", "natural-context-retrieval")
NATURAL_MOST_DOCUMENTS = 400  # 200 passages in 2 copies


@dataclass
class ContextRow:
    limit: int | None  # tokens the row's model reads at once
    accuracy: list[float] = field(default_factory=list)
    stderr: list[float] = field(default_factory=list)
    ndcg: list[float] = field(default_factory=list)
    fact_accuracy: list[float] = field(default_factory=list)
    fact_stderr: list[float] = field(default_factory=list)
    document_accuracy: list[float] = field(default_factory=list)
    hits: list[list[float]] = field(default_factory=list)  # per length, per query: accuracy at 1 among all chunks
    fact_hits: list[list[float]] = field(default_factory=list)


@dataclass
class ContextResults:
    lengths: list[int]
    documents: int
    seed: int
    chunk_tokens: int
    settings: dict = field(default_factory=dict)
    rows: dict[str, ContextRow] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ContextResults:
        return cls(**{**data, "rows": {name: ContextRow(**row) for name, row in data["rows"].items()}})

    @classmethod
    def load(cls, path: str | os.PathLike) -> ContextResults:
        path = Path(path)
        return cls.from_dict(json.loads((path / "context.json" if path.is_dir() else path).read_text()))

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``context.json`` into ``folder``, whole or not at all."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        from .retrieval import write_atomically

        write_atomically(folder / "context.json", lambda p: p.write_text(json.dumps(self.to_dict(), indent=2) + "\n"))
        return folder / "context.json"

    def by_group(self, row: str, length: int, key: str) -> dict[str, float]:
        """Accuracy at 1 among all chunks per ``template`` or ``distance`` bucket, at one length."""
        i = self.lengths.index(length)
        groups: dict[str, list[float]] = {}
        for hit, query in zip(self.rows[row].hits[i], self.settings["queries"][str(length)]):
            groups.setdefault(_group(query, key), []).append(hit)
        return {name: sum(h) / len(h) for name, h in sorted(groups.items())}

    def fact_by_template(self, row: str, length: int) -> dict[str, tuple[float, int]]:
        """Fact accuracy per ``template`` (the natural task: ``nearest-subject``, ``nearest-other``) at one length,
        with each template's query count."""
        i = self.lengths.index(length)
        return fact_by_template(self.rows[row].fact_hits[i], self.settings["queries"][str(length)])

    def table(self, metric: str = "accuracy") -> str:
        """Markdown: a row per length, a column per row of the task, ``metric`` ± its standard error."""
        error = {"accuracy": "stderr", "fact_accuracy": "fact_stderr"}.get(metric)
        lines = ["| tokens | " + " | ".join(self.rows) + " |", "|---|" + "---|" * len(self.rows)]
        for i, length in enumerate(self.lengths):
            cells = [_cell(getattr(r, metric)[i], getattr(r, error)[i] if error else None) for r in self.rows.values()]
            lines.append(f"| {length} | " + " | ".join(cells) + " |")
        chance = self.settings["chance"][metric] if metric in self.settings["chance"] else None
        made = self.settings.get("made", f"{self.documents} documents a length, two questions each")
        lines += [
            "",
            f"{self.settings.get('title', 'context retrieval')}, {metric.replace('_', ' ')}: {made}, "
            f"chunks of at most {self.chunk_tokens} tokens, seed {self.seed}"
            + (f"; chance {', '.join(f'{c:.3f}' for c in chance)}." if chance else "."),
        ]
        if metric == "fact_accuracy" and self.settings.get("task") == CONTEXT_TASKS[1]:
            lines += ["", *self._subsets()]
        return "\n".join(lines)

    def _subsets(self) -> list[str]:
        """The natural task's fact accuracy where the nearest name before the fact chunk is the other person of the
        pair (a chunk that soaks up its nearest name is wrong on all of them) and where it is the subject."""
        names = {"nearest-other": "nearest name: the other", "nearest-subject": "nearest name: the subject"}
        lines = ["| tokens | subset (queries) | " + " | ".join(self.rows) + " |", "|---|---|" + "---|" * len(self.rows)]
        for length in self.lengths:
            per_row = {row: self.fact_by_template(row, length) for row in self.rows}
            for template, label in names.items():
                n = next(iter(per_row.values())).get(template, (0.0, 0))[1]
                cells = [f"{per_row[r].get(template, (float('nan'), 0))[0]:.2f}" for r in self.rows]
                lines.append(f"| {length} | {label} ({n}) | " + " | ".join(cells) + " |")
        lines += ["", "natural-reference retrieval, fact accuracy by the nearest person named before the fact chunk."]
        return lines


def fact_by_template(hits: list[float], queries: list[dict]) -> dict[str, tuple[float, int]]:
    """Fact accuracy and query count per query ``template``: a row's fact hits at one length against the queries
    that length's results record (``settings["queries"]``)."""
    groups: dict[str, list[float]] = {}
    for hit, query in zip(hits, queries):
        groups.setdefault(query["template"], []).append(hit)
    return {name: (sum(h) / len(h), len(h)) for name, h in sorted(groups.items())}


def accuracy_by_haystack(hits: list[float], settings: dict) -> dict[str, float]:
    """Accuracy at 1 per haystack: a row's hits at one length, each query's document found from its place (the
    task lists its queries document by document) and the document's haystack as the task chose it."""
    groups: dict[str, list[float]] = {}
    for i, hit in enumerate(hits):
        groups.setdefault(haystack_of(i // QUESTIONS_PER_DOCUMENT, settings["haystacks"]), []).append(hit)
    return {name: sum(h) / len(h) for name, h in groups.items()}


def _cell(value: float, error: float | None) -> str:
    return f"{value:.2f}" if error is None else f"{value:.2f} ± {error:.2f}"


def _group(query: dict, key: str) -> str:
    return query["template"] if key == "template" else distance_bucket(query["distance"])


def distance_bucket(distance: int) -> str:
    """The bucket of :data:`DISTANCE_BUCKETS` a fact's distance from its naming chunk falls in: "1", "2-3", "16+"."""
    low, high = next(b for b in DISTANCE_BUCKETS if b[0] <= distance <= b[1])
    return str(low) if low == high else f"{low}+" if high > 1 << 20 else f"{low}-{high}"


def check_context_inputs(
    lengths, documents: int, chunk_tokens: int, batch_size: int, task: str = CONTEXT_TASKS[0]
) -> list[int]:
    """One-line ``ValueError`` naming the argument, before any work; the lengths sorted."""
    check_choice("task", task, CONTEXT_TASKS)
    if isinstance(lengths, (str, bytes)) or not lengths:
        raise ValueError(f"lengths must be a non-empty list of token counts such as 512 1024; got {lengths!r}.")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths) or len(set(lengths)) < len(lengths):
        raise ValueError(f"lengths must be distinct positive whole numbers of tokens; got {list(lengths)}.")
    least, most = (
        (len(KINDS) * 2, max_context_documents()) if task == CONTEXT_TASKS[0] else (2 * COPIES, NATURAL_MOST_DOCUMENTS)
    )
    if isinstance(documents, bool) or not isinstance(documents, int) or not least <= documents <= most:
        raise ValueError(f"documents must be a whole number from {least} to {most}; got {documents!r}.")
    if task == CONTEXT_TASKS[1] and documents % COPIES:
        raise ValueError(
            f"documents counts the copies of each passage ({COPIES}): give a multiple of it; got {documents}."
        )
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or not 16 <= chunk_tokens <= 512:
        raise ValueError(f"chunk_tokens must be a whole number of tokens from 16 to 512; got {chunk_tokens!r}.")
    if min(lengths) < 3 * chunk_tokens:
        raise ValueError(
            f"lengths: {min(lengths)} tokens hold fewer than three chunks of {chunk_tokens} (the subject's and two "
            f"facts'); give lengths of at least {3 * chunk_tokens}, or a smaller chunk_tokens."
        )
    if documents * sum(lengths) > 1 << 23:
        raise ValueError(f"lengths: {documents} documents at {sorted(lengths)} tokens are too much text; give fewer.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive whole number; got {batch_size!r}.")
    return sorted(lengths)


def evaluate_context(
    models: dict[str, Any],
    lengths=DEFAULT_CONTEXT_LENGTHS,
    documents: int = 100,
    seed: int = 0,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    batch_size: int = 8,
    baselines=None,
    progress: bool = True,
    task: str = CONTEXT_TASKS[0],
) -> ContextResults:
    """The contextual chunk retrieval task for sentence-transformers ``models`` (the first one's tokenizer measures
    lengths and its chunks are the ``chunk-max`` row; ``late-chunk-max`` rows for every later model that reads
    more than the first); one-vector rows for every model. ``task``: ``context-retrieval`` (invented subjects,
    :mod:`.context_task`) or ``natural-context-retrieval`` (a real passage under other names, :mod:`.natural_context`;
    ``documents`` counts the copies)."""
    lengths = check_context_inputs(lengths, documents, chunk_tokens, batch_size, task)
    rows = context_rows(models, baselines)
    check_lengths_read(models, baselines or [], lengths)  # the rule of every task, before any document is built
    tokenizer = next(iter(models.values())).tokenizer
    build = build_context_task if task == CONTEXT_TASKS[0] else build_natural_task  # looked up now: tests patch them
    tasks = [build(tokenizer, n, documents, seed, chunk_tokens) for n in lengths]
    results = ContextResults(lengths, documents, seed, chunk_tokens, _settings(tasks, task))
    steps = tqdm(
        total=len(rows) * len(tasks), desc=task.removesuffix("-retrieval").replace("-", " "), disable=not progress
    )
    for task in tasks:
        queries, read_whole = {}, {}  # read_whole: a model's document vectors from its late chunks' pass
        for row, (name, kind) in rows.items():
            steps.set_postfix_str(f"{row} at {task.length}")
            model = models[name]
            if name not in queries:
                queries[name] = _encode(model, [q.query for q in task.queries], batch_size)
            chunk_vectors, documents = _row_vectors(model, kind, task, batch_size, read_whole.get(name))
            if documents is not None:
                read_whole[name] = documents
            _score_into(
                results.rows.setdefault(row, ContextRow(_limit(model, kind, chunk_tokens))),
                queries[name],
                chunk_vectors,
                task,
            )
            steps.update()
    steps.close()
    return results


def context_rows(models: dict[str, Any], baselines) -> dict[str, tuple[str, str]]:
    """Row name -> (model, kind), after one-line checks; kinds: ``vector`` (one per document) and the baselines."""
    if not isinstance(models, dict) or not models:
        raise ValueError("models must be a non-empty dict of name -> SentenceTransformer.")
    if (
        baselines is not None
        and isinstance(baselines, str)
        or any(b not in BASELINES for b in baselines or ())
        or len(set(baselines or ())) < len(baselines or ())
    ):
        raise ValueError(f"baselines must be distinct names of {', '.join(BASELINES)}; got {baselines!r}.")
    for name, model in models.items():
        if getattr(model, "tokenizer", None) is None or not isinstance(getattr(model, "max_seq_length", None), int):
            raise ValueError(f"models[{name!r}] must be a sentence-transformers model (a tokenizer, max_seq_length).")
    (first, stock), later = next(iter(models.items())), list(models)[1:]
    if baselines is None:
        longer = any(models[n].max_seq_length > stock.max_seq_length for n in later)
        baselines = ("chunk-max", "late-chunk-max") if longer else ("chunk-max",)
    rows = {}
    if "chunk-max" in baselines:
        rows[f"{first} chunks"] = (first, "chunk-max")
    if "chunk-mean" in baselines:
        rows[f"{first} chunk-mean"] = (first, "chunk-mean")
    if "late-chunk-max" in baselines:
        longer = [n for n in later if models[n].max_seq_length > stock.max_seq_length]
        if not longer:
            raise ValueError("late-chunk-max needs a model after the first that reads more than it: add a patched one.")
        rows |= {f"{n} late chunks": (n, "late-chunk-max") for n in longer}
    return rows | {name: (name, "vector") for name in models}


def _limit(model: Any, kind: str, chunk_tokens: int) -> int:
    return chunk_tokens if kind in ("chunk-max", "chunk-mean") else model.max_seq_length


def _row_vectors(
    model: Any, kind: str, task: ContextTask, batch_size: int, documents: list[torch.Tensor] | None
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per document, a (chunks, dim) tensor: the vector each of its chunks is scored by; and, from the late chunks'
    pass, each document's own vector as ``encode`` gives it (cut at the model's length: the first window of a longer
    one), so the one-vector row (``documents`` when it is given) reads no document again."""
    sizes = [len(pieces) for pieces in task.chunks]
    if kind == "late-chunk-max":
        pieces, whole = late_chunks_and_documents(  # a document past the model's length: its vector as encode cuts it
            model,
            task.documents,
            batch_size=batch_size,
            chunks=task.chunks,
            long_documents="windows",
            cut_documents=True,
        )
        return pieces, whole if all(d is not None for d in whole) else None
    if kind in ("chunk-max", "chunk-mean"):
        flat = _encode(model, [p for pieces in task.chunks for p in pieces], batch_size)
        alone = list(torch.split(flat, sizes))
        return (alone if kind == "chunk-max" else [mean_vector(c).expand(len(c), -1) for c in alone]), None
    if documents is None:
        documents = list(_encode(model, task.documents, batch_size))  # as the model reads: truncated past its limit
    return [v[None].expand(n, -1) for v, n in zip(documents, sizes)], None


def _encode(model: Any, texts: list[str], batch_size: int) -> torch.Tensor:
    with torch.no_grad():
        vectors = model.encode(texts, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
    return torch.as_tensor(vectors).detach().float().cpu()


def _score_into(row: ContextRow, queries: torch.Tensor, chunk_vectors: list[torch.Tensor], task: ContextTask) -> None:
    offsets = [0]
    for c in chunk_vectors:
        offsets.append(offsets[-1] + len(c))
    scores = cosine_scores(queries, torch.cat(chunk_vectors))
    gold = [offsets[q.document] + q.chunk for q in task.queries]
    hits = [_tie_share(scores[i], g) for i, g in enumerate(gold)]
    fact_hits = [_fact_hit(scores[i], i, gold, task) for i in range(len(gold))]
    document_hits = [
        _tie_share(torch.stack([scores[i, a:b].max() for a, b in zip(offsets, offsets[1:])]), q.document)
        for i, q in enumerate(task.queries)
    ]
    n = len(hits)
    for target, values in (
        (row.accuracy, hits),
        (row.fact_accuracy, fact_hits),
        (row.document_accuracy, document_hits),
    ):
        target.append(sum(values) / n)
    row.stderr.append(_stderr(hits))
    row.fact_stderr.append(_stderr(fact_hits))
    row.ndcg.append(sum(_ndcg(scores[i], g) for i, g in enumerate(gold)) / n)
    row.hits.append(hits)
    row.fact_hits.append(fact_hits)


def _fact_hit(scores: torch.Tensor, i: int, gold: list[int], task: ContextTask) -> float:
    """Accuracy at 1 among the chunks that answer query ``i``'s question in every document."""
    same = [j for j, q in enumerate(task.queries) if q.relation == task.queries[i].relation]
    candidates = scores[[gold[j] for j in same]]
    return _tie_share(candidates, same.index(i))


def _tie_share(scores: torch.Tensor, gold: int) -> float:
    """1 when ``gold`` scores highest, 1/k when it ties with k - 1 others at the top, else 0."""
    top = scores.max()
    return float(scores[gold] == top) / int((scores == top).sum())


def _ndcg(scores: torch.Tensor, gold: int) -> float:
    """nDCG@10 with one relevant item: 1 / log2(rank + 1), in expectation over the order of a tie."""
    above = int((scores > scores[gold]).sum())
    tied = int((scores == scores[gold]).sum())
    ranks = range(above + 1, above + tied + 1)
    return sum(1 / math.log2(r + 1) for r in ranks if r <= 10) / tied


def _stderr(values: list[float]) -> float:
    p = sum(values) / len(values)
    return math.sqrt(max(p * (1 - p), 0.0) / len(values))


def _settings(tasks: list[ContextTask], task: str = CONTEXT_TASKS[0]) -> dict:
    chunks = {str(t.length): sum(len(p) for p in t.chunks) for t in tasks}
    per_kind = len(tasks[0].chunks) / len(KINDS)
    natural = {} if task == CONTEXT_TASKS[0] else _natural_settings(tasks)
    return {
        "haystacks": list(HAYSTACKS),  # accuracy_by_haystack reads which text each document was cut from here
        "templates": list(TEMPLATES),
        "templates_trained_on": [],
        "example_query": tasks[0].queries[0].query,
        "chance": {"accuracy": [1 / chunks[str(t.length)] for t in tasks], "fact_accuracy": [1 / per_kind]},
        "chunks": chunks,
        "fingerprints": {str(t.length): t.fingerprint() for t in tasks},
        "queries": {
            str(t.length): [{"template": q.template, "distance": q.distance, "relation": q.relation} for q in t.queries]
            for t in tasks
        },
    } | natural


def _natural_settings(tasks: list[ContextTask]) -> dict:
    """What the natural-reference task's results say of themselves in place of the context task's: its haystack,
    its copies (fact accuracy's chance: one in them), its balance of nearest names, and the table's caption."""
    passages = len(tasks[0].chunks) // COPIES
    return {
        "task": CONTEXT_TASKS[1],
        "title": "natural-reference retrieval",
        "made": f"{passages * COPIES} documents a length ({passages} passages x {COPIES} copies, two people's "
        "invented names swapped), each fact chunk asked once a name",
        "haystacks": list(EVALUATION_SOURCE.haystacks),
        "templates": ["nearest-subject", "nearest-other"],
        "copies": COPIES,
        "nearest": {
            str(t.length): {k: sum(q.template == f"nearest-{k}" for q in t.queries) for k in ("subject", "other")}
            for t in tasks
        },
        "chance": {
            "accuracy": [1 / sum(len(p) for p in t.chunks) for t in tasks],
            "fact_accuracy": [1 / COPIES],
        },
    }
