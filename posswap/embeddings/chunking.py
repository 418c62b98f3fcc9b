"""What a user with a vector database does with a long document, and what a long model adds to it.

- **chunk-mean / chunk-max**: the document cut into pieces the model reads whole, each embedded alone; one vector
  (the chunks' mean) or a vector per chunk (a document scores its best chunk).
- **late chunking** (Günther et al. 2024, "Late Chunking: Contextual Chunk Embeddings Using Long-Context
  Embedding Models"): the long model reads the whole document once and its token outputs are mean-pooled per
  chunk, so each chunk's vector carries the document's context: :mod:`.late_chunking`.

Chunk sizes count the tokenizer's special tokens ([CLS] and [SEP]), as ``max_seq_length`` does: a chunk of 256 is
a text the model reads whole at a limit of 256.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .retrieval_tasks import special_tokens

BASELINES = ("chunk-mean", "chunk-max", "late-chunk-max")


def split_into_chunks(tokenizer, text: str, chunk_tokens: int) -> list[str]:
    """``text`` cut at token boundaries into pieces of at most ``chunk_tokens`` tokens, special tokens counted;
    each piece is a slice of the text itself (character offsets), so re-tokenizing it gives the same tokens."""
    size = chunk_tokens - special_tokens(tokenizer)
    if size < 1:
        raise ValueError(f"chunk_tokens must leave room for text beside the special tokens; got {chunk_tokens}.")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    offsets = encoded["offset_mapping"]
    if not offsets:
        return [text]
    starts = range(0, len(offsets), size)
    return [text[offsets[i][0] : offsets[min(i + size, len(offsets)) - 1][1]] for i in starts]


def split_into_pieces(tokenizer, text: str, chunk_tokens: int) -> list[str]:
    """The tokens of :func:`split_into_chunks` as pieces that join to ``text`` (each keeps the whitespace after
    it): the same spans for :func:`posswap.late_chunks`."""
    chunks = split_into_chunks(tokenizer, text, chunk_tokens)
    starts, at = [], 0
    for chunk in chunks:
        at = text.index(chunk, at)
        starts.append(at)
        at += len(chunk)
    starts[0] = 0
    return [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]


def chunk_vectors(model, texts: list[str], chunk_tokens: int, batch_size: int = 8) -> list[torch.Tensor]:
    """Per text, a (chunks, dim) tensor: every chunk embedded alone (the stock model's way)."""
    pieces = [split_into_chunks(model.tokenizer, text, chunk_tokens) for text in texts]
    flat = [piece for chunks in pieces for piece in chunks]
    with torch.no_grad():
        vectors = model.encode(flat, batch_size=batch_size, convert_to_tensor=True, show_progress_bar=False)
    vectors = torch.as_tensor(vectors).detach().float().cpu()
    return list(torch.split(vectors, [len(chunks) for chunks in pieces]))


def after_pooling(model: Any, pooling_at: int, pooled: torch.Tensor) -> torch.Tensor:
    """Mean-pooled vectors through the model's modules after its pooling (normalisation, dense), as a sentence
    embedding goes: what a chunk's vector is."""
    features = {"sentence_embedding": pooled}
    for module in list(model)[pooling_at + 1 :]:
        features = module(features)
    return features["sentence_embedding"]


def mean_pooling_index(model: Any, user: str) -> int:
    """The index of a sentence-transformers model's mean Pooling module; ``user`` (what needs it) names the error
    otherwise."""
    from ..sentence_models import is_sentence_transformer

    if not is_sentence_transformer(model):
        raise ValueError(
            f"{user} needs a sentence-transformers model (its token outputs and pooling); got {type(model).__name__}."
        )
    modules = list(model)
    pooling_at = next((i for i, m in enumerate(modules) if type(m).__name__ == "Pooling"), None)
    pooling = modules[pooling_at] if pooling_at is not None else None
    # sentence-transformers 6 names the mode; 5 had a method for it.
    mode = getattr(pooling, "pooling_mode", None) or (pooling.get_pooling_mode_str() if pooling is not None else None)
    if mode != "mean":
        raise ValueError(
            f"{user} mean-pools each chunk, and this model pools with {mode or 'no Pooling module'}: its chunk "
            "vectors would not be what it was trained to give. Use a model with mean pooling."
        )
    return pooling_at


def cosine_scores(queries: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
    """(queries, documents) cosine similarities."""
    return F.normalize(queries, dim=-1) @ F.normalize(documents, dim=-1).T


def mean_vector(chunks: torch.Tensor) -> torch.Tensor:
    """One vector for a document from its chunks': the mean of their unit vectors."""
    return F.normalize(chunks, dim=-1).mean(dim=0)


def best_chunk_scores(queries: torch.Tensor, documents: list[torch.Tensor]) -> torch.Tensor:
    """(queries, documents) cosine scores where a document scores its best chunk."""
    return torch.stack([cosine_scores(queries, chunks).max(dim=1).values for chunks in documents], dim=1)
