"""What replaces a learned position table that a method no longer uses (``absolute="drop"``)."""

from __future__ import annotations

import torch
from torch import nn

from .architectures import Sites


class DroppedPositionTable(nn.Module):
    """Stands where the ``nn.Embedding`` of positions was: the embeddings code still calls it, and gets zeros.

    Why a parameter-free module and not a table frozen at zero: nothing is left that DDP would report as an
    unused parameter, ``state_dict`` carries no dead rows, and the positions may exceed the old table. The
    zeros are an expanded 0-dim tensor (no memory); a 0-element buffer follows ``model.to(dtype/device)``.
    """

    def __init__(self, embedding_dim: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.register_buffer("anchor", torch.empty(0, dtype=dtype, device=device), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.anchor.new_zeros(()).expand(*position_ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"embedding_dim={self.embedding_dim} (dropped by posswap: returns zeros)"


def dropped_table(sites: Sites) -> DroppedPositionTable | None:
    """The replacement for ``sites.table`` (None when it is already dropped). Built before anything changes."""
    table = sites.table
    if table is None:
        return None
    return DroppedPositionTable(table.embedding_dim, table.weight.dtype, table.weight.device)


def drop_table(sites: Sites, replacement: DroppedPositionTable | None) -> None:
    if replacement is not None:
        setattr(sites.owner, sites.arch.table, replacement)
