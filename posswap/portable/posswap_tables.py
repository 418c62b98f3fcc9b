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

    def forward(self, *args, **kwargs) -> torch.Tensor:
        # A zero that broadcasts: embeddings + 0 costs one add, never a (batch, length, dim) table read.
        device = next(a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        return torch.zeros((), device=device)

    def extra_repr(self) -> str:
        return f"dim={self.dim} (learned table dropped by posswap)"


class SinusoidalPositions(nn.Module):
    """The fixed sin/cos table, times ``scale``: row ``p`` is the sinusoid of position ``p - offset`` (RoBERTa
    numbers positions from ``padding_idx + 1``; its padding rows get position 0).

    The table is made on first use, per device, in float32 (never a buffer: the meta device of transformers'
    loading would leave it without values, and ``model.to(torch.bfloat16)`` would round it). Rows are returned in
    the model's dtype, which the empty ``dtype_probe`` buffer follows through ``.to()`` / ``.half()`` and loading.
    """

    def __init__(
        self, dim: int, rows: int, offset: int, theta: float, scale: float, like: torch.Tensor, inner_offset: int = 0
    ):
        super().__init__()
        self.dim, self.rows, self.offset, self.theta, self.scale = dim, rows, offset, theta, scale
        self.inner_offset = inner_offset  # OPT's and BART's tables add it to the ids themselves: called_rows
        self.register_buffer("dtype_probe", torch.empty(0, dtype=like.dtype, device=like.device), persistent=False)
        self._tables: dict[torch.device, torch.Tensor] = {}

    def table(self, device) -> torch.Tensor:
        device = torch.device(device)
        if device not in self._tables:
            positions = (torch.arange(self.rows) - self.offset).clamp(min=0)
            rows = sinusoidal_table(self.rows - self.offset, self.dim, self.theta) * self.scale
            self._tables[device] = rows[positions].to(device)
        return self._tables[device]

    def forward(self, *args, **kwargs) -> torch.Tensor:
        rows = called_rows(args, kwargs, self.inner_offset)
        return self.table(rows.device)[rows].to(self.dtype_probe.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, rows={self.rows}, offset={self.offset}, theta={self.theta}, scale={self.scale:.4g} (fixed)"


def called_rows(args: tuple, kwargs: dict, inner_offset: int) -> torch.Tensor:
    """The table rows a call asks for. BERT and GPT-2 call their table with the rows; OPT's and BART's tables are
    called with their caller's arguments (a mask or ids for the shape, the cache length, ``position_ids``) and add
    ``inner_offset`` themselves (their learned table's forward, repeated here)."""
    if not inner_offset:
        return args[0] if args else kwargs["position_ids"]
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        shape, cache = args[0], args[1] if len(args) > 1 else kwargs.get("cache_length", 0)
        position_ids = torch.arange(cache, cache + shape.shape[1], device=shape.device)[None]
    return position_ids + inner_offset
