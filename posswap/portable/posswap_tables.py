"""What stands where the learned position table was, once a method has taken it out: nothing
(:class:`NoPositions`: RoPE, ALiBi and NoPE) or the fixed sin/cos table (:class:`SinusoidalPositions`).

Both are called as the table was (``module(position_ids)``) and hold no parameters: no unused parameter for DDP,
no weight in the checkpoint, nothing that ``train.trainable: full`` could move.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
from torch import nn

from .posswap_functional import sinusoidal_table

ABSOLUTE_CHOICES = ("drop", "keep")  # what a method that replaces the table does with it: the `absolute` option


class NoPositions(nn.Module):
    """Adds nothing. The embeddings code still calls the table, so it cannot simply be deleted; a module without
    parameters (rather than a table frozen at zero) leaves DDP no unused parameter and the checkpoint no dead weight.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        # A zero that broadcasts: embeddings + 0 costs one add, never a (batch, length, dim) table read.
        return torch.zeros((), device=position_ids.device)

    def extra_repr(self) -> str:
        return f"dim={self.dim} (learned table dropped by posswap)"


class SinusoidalPositions(nn.Module):
    """The fixed sin/cos table, times ``scale``: row ``p`` is the sinusoid of position ``p - offset`` (RoBERTa
    numbers positions from ``padding_idx + 1``; its padding rows get position 0).

    The table is made on first use, per device, in float32 (never a buffer: the meta device of transformers'
    loading would leave it without values, and ``model.to(torch.bfloat16)`` would round it). Rows are returned in
    the model's dtype, which the empty ``dtype_probe`` buffer follows through ``.to()`` / ``.half()`` and loading.
    """

    def __init__(self, dim: int, rows: int, offset: int, theta: float, scale: float, like: torch.Tensor):
        super().__init__()
        self.dim, self.rows, self.offset, self.theta, self.scale = dim, rows, offset, theta, scale
        self.register_buffer("dtype_probe", torch.empty(0, dtype=like.dtype, device=like.device), persistent=False)
        self._tables: dict[torch.device, torch.Tensor] = {}

    def table(self, device) -> torch.Tensor:
        device = torch.device(device)
        if device not in self._tables:
            positions = (torch.arange(self.rows) - self.offset).clamp(min=0)
            rows = sinusoidal_table(self.rows - self.offset, self.dim, self.theta) * self.scale
            self._tables[device] = rows[positions].to(device)
        return self._tables[device]

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table(position_ids.device)[position_ids].to(self.dtype_probe.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, rows={self.rows}, offset={self.offset}, theta={self.theta}, scale={self.scale:.4g} (fixed)"
