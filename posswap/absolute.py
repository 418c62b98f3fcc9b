"""What RoPE and ALiBi do with the learned table they replace: ``drop`` it or ``keep`` it (extended)."""

from __future__ import annotations

import torch
from torch import nn

from .architectures import Sites
from .config import check_choice

ABSOLUTE_CHOICES = ("drop", "keep")


class NoPositions(nn.Module):
    """Stands where the learned table was and adds nothing.

    The embeddings code still calls the table, so it cannot simply be deleted; a module without parameters
    (rather than a table frozen at zero) leaves DDP no unused parameter and the checkpoint no dead weight.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        # A zero that broadcasts: embeddings + 0 costs one add, never a (batch, length, dim) table read.
        return torch.zeros((), device=position_ids.device)

    def extra_repr(self) -> str:
        return f"dim={self.dim} (learned table dropped by posswap)"


def check_absolute(sites: Sites, absolute: str) -> None:
    check_choice("absolute", absolute, ABSOLUTE_CHOICES)
    if absolute == "keep" and sites.table is None:
        raise ValueError(
            "absolute='keep' needs the learned position table, but this model has none left (it was dropped). "
            "Use absolute='drop' or start from the original checkpoint."
        )


def planned_table_weight(sites: Sites, absolute: str, max_length: int) -> torch.Tensor | None:
    """For 'keep': the table extended by copy (old positions keep their vectors). Built before any change."""
    from .methods.interpolate import resized_table_weight

    if absolute == "keep" and max_length != sites.max_length:
        return resized_table_weight(sites, max_length, "copy")
    return None


def apply_absolute(sites: Sites, absolute: str, new_weight: torch.Tensor | None) -> None:
    from .methods.interpolate import replace_table_weight

    if absolute == "drop":
        if sites.table is not None:
            setattr(sites.owner, sites.arch.table, NoPositions(sites.table.embedding_dim))
    elif new_weight is not None:
        replace_table_weight(sites.table, new_weight)
