"""The model as the recipe found it, before its patch, as a teacher: short texts it read whole (passages and
documents of its own limit, cut from the training text) with its embeddings of them, trained with ``1 - cosine``
beside the ranking pairs. The pairs teach the patched model to read further; these keep what it gave within its
old limit, which the new position rows would otherwise move (the stride placement's short inputs read
interpolated rows)."""

from __future__ import annotations

from typing import Any

import datasets
import torch
import torch.nn.functional as F
from torch import nn

from ...sentence_models import transformer_module
from .data import document_pairs


def teacher_rows(
    model: Any, spec: str, rows: int, anchor_words: int, seed: int, text_column: str
) -> datasets.Dataset | None:
    """``rows`` of ``text`` (a passage of ``anchor_words`` words, or a document of the model's own limit, in
    turn) and ``label`` (``model``'s embedding of it), None for none: call before the model is patched."""
    if not rows:
        return None
    limit = transformer_module(model).max_seq_length
    pairs = document_pairs(spec, model.tokenizer, [limit], (rows + 1) // 2, anchor_words, seed + 1, text_column)
    texts = [text for pair in zip(pairs["anchor"], pairs["positive"]) for text in pair][:rows]
    with torch.no_grad():
        vectors = model.encode(texts, batch_size=8, convert_to_tensor=True, show_progress_bar=False)
    return datasets.Dataset.from_dict({"text": texts, "label": vectors.float().cpu().tolist()})


class TeacherLoss(nn.Module):
    """``1 - cosine`` between the model's embedding of each text and the teacher's (the ``label``): the angle is
    what retrieval reads. sentence-transformers' ``MSELoss`` (its distillation loss) would also weigh the vectors'
    norms, which a model without a Normalize module is free to change. No weight: its batches are steps of their
    own beside the pairs', and AdamW's update does not see a loss's scale (a weight of 4 gave the same retrieval to
    two decimals)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, sentence_features, labels: torch.Tensor) -> torch.Tensor:
        student = self.model(sentence_features[0])["sentence_embedding"]
        return (1 - F.cosine_similarity(student, labels.to(student), dim=-1)).mean()
