"""Late chunking (Günther et al. 2024, "Late Chunking: Contextual Chunk Embeddings Using Long-Context Embedding
Models"): the model reads the whole document once and its token outputs are mean-pooled per piece, so each piece's
vector carries what the rest of the document says.

Pieces are the user's (``chunks=``: strings that join to the text), or every ``chunk_tokens`` tokens. A token
belongs to the piece its first character is in; [CLS] to the first piece and [SEP] to the last, so a text given
as one piece gets exactly its ``encode`` embedding. A document longer than the model reads is the caller's
choice (``long_documents``): ``"refuse"`` (one line naming it), or ``"windows"``: overlapping windows of the
model's length, each piece pooled in the window that holds it with the most context on its shorter side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .chunking import after_pooling, mean_pooling_index
from .text_pieces import split_text

LONG_DOCUMENTS = ("refuse", "windows")


@dataclass(frozen=True)
class Span:
    """A piece as tokens of its text (special tokens not counted): ``[start, end)``."""

    start: int
    end: int


@dataclass(frozen=True)
class LateChunk:
    """A piece of a text with its late-chunked vector: ``text[start:end] == piece``."""

    text: str
    start: int
    end: int
    vector: torch.Tensor


def late_chunks(
    model: Any,
    texts: list[str],
    chunk_tokens: int | None = None,
    batch_size: int = 8,
    chunks: list[list[str]] | None = None,
    long_documents: str = "refuse",
) -> list[torch.Tensor]:
    """Per text, a (pieces, dim) tensor of late-chunked embeddings: the model reads the text once and its token
    outputs are mean-pooled per piece, then go through the modules after the pooling (normalisation, dense) as a
    sentence embedding does.

    Pieces: ``chunks`` (per text, strings that joined are the text: a vector each; one piece is ``encode`` of the
    text), else every ``chunk_tokens`` tokens (default 256, special tokens counted; a text within it gives its
    ``encode`` embedding). ``long_documents``: a text longer than the model's ``max_seq_length`` is refused
    (``"refuse"``, the default) or read in overlapping windows (``"windows"``), never silently cut.

    ``model``: a sentence-transformers model with mean pooling (late chunking is defined on mean pooling).
    """
    return late_chunks_and_documents(model, texts, chunk_tokens, batch_size, chunks, long_documents)[0]


def late_chunks_and_documents(
    model: Any,
    texts: list[str],
    chunk_tokens: int | None = None,
    batch_size: int = 8,
    chunks: list[list[str]] | None = None,
    long_documents: str = "refuse",
    cut_documents: bool = False,
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """:func:`late_chunks`, and each text's own embedding (``encode``'s) from the same pass: the mean of all its
    token outputs is the pieces' means weighted by their token counts. For a text read in windows, None (no pass
    read it whole), or with ``cut_documents`` what ``encode`` gives it: the mean of its first window, which holds
    the tokens ``encode`` keeps when it cuts the text at the model's length. An evaluation that scores both reads
    each text once."""
    pooling_at = _check_texts(model, texts, batch_size, long_documents)
    tokenizer = model.tokenizer
    encoded = [tokenizer(t, add_special_tokens=False, return_offsets_mapping=True, verbose=False) for t in texts]
    if chunks is not None:
        spans = pieces_as_spans(texts, chunks, encoded, chunk_tokens)
    else:
        spans = [_fixed_spans(len(e["input_ids"]), _chunk_size(chunk_tokens), _specials(tokenizer)) for e in encoded]
    limit = _check_lengths(model, encoded, spans, long_documents)
    model.eval()  # as encode does: no dropout
    pieces, documents = [], []
    with torch.no_grad():
        for e, s in zip(encoded, spans):
            means, counts, first = _pool_text(model, e["input_ids"], s, limit, batch_size)
            pieces.append(after_pooling(model, pooling_at, means).detach().float().cpu())
            if len(e["input_ids"]) <= limit:
                whole = (counts[:, None] * means).sum(dim=0, keepdim=True) / counts.sum()
            elif cut_documents:
                whole = first.mean(dim=0, keepdim=True)  # what encode keeps of it: the first window
            else:
                documents.append(None)
                continue
            documents.append(after_pooling(model, pooling_at, whole)[0].detach().float().cpu())
    return pieces, documents


def late_chunk_pieces(
    model: Any, texts: list[str], max_tokens: int = 256, batch_size: int = 8, long_documents: str = "refuse"
) -> list[list[LateChunk]]:
    """Per text, its pieces cut at paragraph and sentence ends within ``max_tokens`` (:func:`posswap.split_text`),
    each with its text, character span and late-chunked vector: what a vector database stores."""
    _check_texts(model, texts, batch_size, long_documents)
    pieces = [split_text(model.tokenizer, text, max_tokens) for text in texts]
    vectors = late_chunks(model, texts, batch_size=batch_size, chunks=pieces, long_documents=long_documents)
    return [_with_vectors(p, v) for p, v in zip(pieces, vectors)]


def _with_vectors(pieces: list[str], vectors: torch.Tensor) -> list[LateChunk]:
    out, at = [], 0
    for piece, vector in zip(pieces, vectors):
        out.append(LateChunk(piece, at, at + len(piece), vector))
        at += len(piece)
    return out


def _chunk_size(chunk_tokens: int | None) -> int:
    chunk_tokens = 256 if chunk_tokens is None else chunk_tokens
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be a positive whole number of tokens; got {chunk_tokens!r}.")
    return chunk_tokens


def _special_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The token ids the tokenizer puts before and after every text ([CLS] and [SEP] for BERT)."""
    full = tokenizer("a")["input_ids"]
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    at = next(i for i in range(len(full)) if full[i : i + len(bare)] == bare)
    return full[:at], full[at + len(bare) :]


def _specials(tokenizer) -> tuple[int, int]:
    """Special tokens before and after a text ([CLS] and [SEP]: 1 and 1)."""
    before, after = _special_ids(tokenizer)
    return len(before), len(after)


def _fixed_spans(count: int, chunk_tokens: int, specials: tuple[int, int]) -> list[Span]:
    """Every ``chunk_tokens`` tokens of the text with its special tokens (the first piece holds [CLS]), as spans of
    its text tokens."""
    before = specials[0]
    edges = [max(0, min(count, k - before)) for k in range(0, count + sum(specials), chunk_tokens)] + [count]
    spans = [Span(a, b) for a, b in zip(edges, edges[1:]) if b > a]
    return spans or [Span(0, 0)]


def pieces_as_spans(texts, chunks, encoded, chunk_tokens) -> list[list[Span]]:
    """The user's pieces as token spans, after one-line checks (they join to the text; each holds a token)."""
    if chunk_tokens is not None:
        raise ValueError("chunks and chunk_tokens: give one (chunks are the pieces; chunk_tokens cuts every N tokens).")
    if isinstance(chunks, str) or not isinstance(chunks, (list, tuple)) or len(chunks) != len(texts):
        raise ValueError(f"chunks must be a list with one list of pieces per text ({len(texts)}); got {chunks!r:.80}.")
    spans = []
    for i, (text, pieces, tokens) in enumerate(zip(texts, chunks, encoded)):
        if isinstance(pieces, str) or not pieces or not all(isinstance(p, str) for p in pieces):
            raise ValueError(f"chunks[{i}] must be a non-empty list of strings (the pieces of texts[{i}]).")
        if "".join(pieces) != text:
            raise ValueError(f"chunks[{i}]: the pieces, joined, must be texts[{i}] exactly (whitespace included).")
        spans.append(_spans_of_pieces(pieces, [start for start, _ in tokens["offset_mapping"]], i))
    return spans


def _spans_of_pieces(pieces: list[str], starts: list[int], text_index: int) -> list[Span]:
    spans, at, token = [], 0, 0
    for j, piece in enumerate(pieces):
        at += len(piece)
        first = token
        while token < len(starts) and starts[token] < at:
            token += 1
        if token == first and len(pieces) > 1:
            raise ValueError(
                f"chunks[{text_index}][{j}] holds no token ({piece!r:.40}): join it to a neighbouring piece."
            )
        spans.append(Span(first, token))
    return spans


def _check_texts(model: Any, texts, batch_size: int, long_documents: str) -> int:
    """The index of the model's pooling module, after one-line checks of every argument."""
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be a list of strings; for one text, pass [text].")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive whole number; got {batch_size!r}.")
    if long_documents not in LONG_DOCUMENTS:
        raise ValueError(f"long_documents must be one of {', '.join(LONG_DOCUMENTS)}; got {long_documents!r}.")
    return mean_pooling_index(model, "late_chunks")


def _check_lengths(model: Any, encoded, spans: list[list[Span]], long_documents: str) -> int:
    """Text tokens one pass reads; a longer text refused (``"refuse"``) or a piece longer than a window refused."""
    limit = model.max_seq_length - model.tokenizer.num_special_tokens_to_add(pair=False)
    for i, tokens in enumerate(encoded):
        count = len(tokens["input_ids"])
        if count > limit and long_documents == "refuse":
            raise ValueError(
                f"texts[{i}] is {count} tokens and the model reads {limit} (max_seq_length "
                f"{model.max_seq_length}): pass long_documents='windows' to read it in overlapping windows, or "
                "split it."
            )
        longest = max(s.end - s.start for s in spans[i])
        if longest > limit:
            raise ValueError(
                f"texts[{i}]: a piece of {longest} tokens is longer than the {limit} the model reads at once: "
                "give smaller pieces."
            )
    return limit


def _pool_text(
    model: Any, ids: list[int], spans: list[Span], limit: int, batch_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pieces, dim) means of the pieces' token outputs, each read in the window chosen for it, (pieces,) the
    number of outputs each mean is over, and the first window's outputs (special tokens included)."""
    windows = window_for_each(spans, len(ids), limit)
    starts = sorted(set(windows))
    outputs = dict(zip(starts, _window_outputs(model, ids, starts, limit, batch_size)))
    before, _ = _specials(model.tokenizer)
    means, counts = [], []
    for k, (span, start) in enumerate(zip(spans, windows)):
        out = outputs[start]
        end = min(len(ids), start + limit)
        rows = [before + t - start for t in range(span.start, span.end)]
        if k == 0 and start == 0:
            rows = list(range(before)) + rows  # [CLS] with the first piece
        if k == len(spans) - 1 and end == len(ids):
            rows = rows + list(range(before + end - start, len(out)))  # [SEP] with the last
        means.append(out[rows].mean(dim=0))
        counts.append(len(rows))
    # The first piece starts at token 0, so the window at 0 is always read: what encode keeps of a longer text.
    return torch.stack(means), torch.tensor(counts, dtype=means[0].dtype), outputs[0]


def window_for_each(spans: list[Span], count: int, limit: int) -> list[int]:
    """Per span, the first text token of the window it is read in: the whole text when it fits, else a window of
    ``limit`` tokens from a grid of half-window strides (shared by pieces, fewer passes) that holds the span
    with the most context on its shorter side."""
    if count <= limit:
        return [0] * len(spans)
    stride = max(1, limit // 2)
    grid = sorted(set(range(0, count - limit, stride)) | {count - limit})
    chosen = []
    for span in spans:
        holding = [s for s in grid if s <= span.start and span.end <= s + limit]
        if not holding:  # a piece longer than half a window, between grid windows: one centred on it
            holding = [min(count - limit, max(0, span.start - (limit - (span.end - span.start)) // 2))]
        chosen.append(max(holding, key=lambda s: min(span.start - s, s + limit - span.end)))
    return chosen


def _window_outputs(model: Any, ids: list[int], starts: list[int], limit: int, batch_size: int) -> list[torch.Tensor]:
    """The token outputs (special tokens included, padding dropped) of each window ``ids[start:start + limit]``."""
    tokenizer = model.tokenizer
    before, after = _special_ids(tokenizer)
    inputs = [before + ids[s : s + limit] + after for s in starts]
    outputs = []
    for i in range(0, len(inputs), batch_size):
        features = _features(tokenizer, inputs[i : i + batch_size], model.device)
        out = model(features)
        for tokens, mask in zip(out["token_embeddings"], features["attention_mask"]):
            outputs.append(tokens[: int(mask.sum())].float().cpu())
    return outputs


def _features(tokenizer, inputs: list[list[int]], device) -> dict[str, torch.Tensor]:
    """A padded batch as the model's tokenizer would give it (right padding; token types 0 where it has them)."""
    width = max(len(x) for x in inputs)
    ids = torch.full((len(inputs), width), tokenizer.pad_token_id or 0, dtype=torch.long)
    mask = torch.zeros((len(inputs), width), dtype=torch.long)
    for row, x in enumerate(inputs):
        ids[row, : len(x)] = torch.tensor(x)
        mask[row, : len(x)] = 1
    features = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in tokenizer.model_input_names:
        features["token_type_ids"] = torch.zeros_like(ids)
    return {k: v.to(device) for k, v in features.items()}
