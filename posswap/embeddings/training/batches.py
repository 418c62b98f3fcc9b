"""The embedding trainer's batches: the context rows' groups whole, every other dataset without duplicates.

Imported when a trainer is built (sentence-transformers is a heavy import).
"""

from __future__ import annotations

import torch
from sentence_transformers.base.sampler import DefaultBatchSampler, NoDuplicatesBatchSampler

from .context import GROUPED


class ContextBatchSampler(DefaultBatchSampler):
    """The context rows' groups as batches, in an order drawn from the seed (each epoch another)."""

    def __iter__(self):
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        count = len(self)
        for g in torch.randperm(count, generator=generator).tolist():
            yield list(range(g * self.batch_size, (g + 1) * self.batch_size))

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size  # the base class keeps the dataset as its sampler


def context_batch_sampler(dataset, **kwargs) -> DefaultBatchSampler:
    """The trainer's batch sampler: the context rows' groups whole; for every other dataset no duplicate in a batch
    (a repeated passage would be its own false negative)."""
    if getattr(dataset, "info", None) is not None and dataset.info.description == GROUPED:
        return ContextBatchSampler(dataset, **kwargs)
    return NoDuplicatesBatchSampler(dataset, **kwargs)
