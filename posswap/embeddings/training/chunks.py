"""The model's own chunks as a teacher for its late chunks (``embedding.chunk_teacher``): documents of the recipe's
longest length, cut into the pieces the model read whole before its patch (its old limit, special tokens counted,
:func:`~posswap.embeddings.chunking.chunk_vectors`), each piece with its embedding then. Trained with
``1 - cosine`` between that embedding and the patched model's token outputs over the same piece, mean-pooled,
while it reads the whole document: each part of a long input is then read as the stock model read it alone, which
is what late chunking needs (untrained, a late chunk of 2048 tokens is read worse than the same chunk alone)."""

from __future__ import annotations

from typing import Any

import datasets
import torch
import torch.nn.functional as F
from torch import nn

from ...sentence_models import transformer_module
from ..chunking import after_pooling, chunk_vectors, mean_pooling_index
from .data import document_pairs


def chunk_teacher_rows(
    model: Any, spec: str, rows: int, length: int, seed: int, text_column: str
) -> datasets.Dataset | None:
    """``rows`` of ``text`` (a document of ``length`` tokens) and ``label`` (its pieces' embeddings by ``model``
    as it is now, flattened, zero rows after the last piece so that every label has as many), None for none:
    call before the model is patched."""
    if not rows:
        return None
    mean_pooling_index(model, "embedding.chunk_teacher")  # before any work: the pieces are mean-pooled
    limit = transformer_module(model).max_seq_length
    texts = document_pairs(spec, model.tokenizer, [length], rows, 1, seed + 2, text_column)["positive"]
    vectors = chunk_vectors(model, texts, limit)  # the stock model's plain chunks, each read alone
    most = max(len(v) for v in vectors)
    labels = [F.pad(v, (0, 0, 0, most - len(v))).flatten().tolist() for v in vectors]
    return datasets.Dataset.from_dict({"text": texts, "label": labels})


def piece_means(tokens: torch.Tensor, mask: torch.Tensor, piece_tokens: int, special: int) -> list[torch.Tensor]:
    """Per text of a batch, the (pieces, dim) means of its token outputs over each piece of ``piece_tokens`` text
    tokens, the special tokens (``special``: [CLS] before, [SEP] after) left out as the pieces read alone hold
    their own."""
    means = []
    for outputs, keep in zip(tokens, mask):
        count = int(keep.sum())
        text = outputs[special // 2 : count - (special - special // 2)]
        means.append(torch.stack([piece.mean(dim=0) for piece in torch.split(text, piece_tokens)]))
    return means


class LateChunkLoss(nn.Module):
    """``1 - cosine`` between each piece's mean token output in the whole document and the teacher's embedding of
    that piece read alone (the ``label`` rows), averaged over the pieces; the modules after the pooling
    (normalisation, dense) apply to the means as they do to a sentence embedding."""

    def __init__(self, model: nn.Module, chunk_tokens: int):
        super().__init__()
        self.model = model
        self.special = model.tokenizer.num_special_tokens_to_add(pair=False)
        self.piece_tokens = chunk_tokens - self.special
        self.pooling_at = mean_pooling_index(model, "embedding.chunk_teacher")

    def forward(self, sentence_features, labels: torch.Tensor) -> torch.Tensor:
        out = self.model(sentence_features[0])
        means = piece_means(out["token_embeddings"], out["attention_mask"], self.piece_tokens, self.special)
        losses = []
        for pooled, target in zip(means, labels.view(len(means), -1, means[0].shape[-1])):
            pieces = min(len(pooled), int((target.abs().sum(dim=-1) > 0).sum()))  # a token more or less: as many
            student = after_pooling(self.model, self.pooling_at, pooled[:pieces])
            losses.append((1 - F.cosine_similarity(student, target[:pieces].to(student), dim=-1)).mean())
        return torch.stack(losses).mean()
