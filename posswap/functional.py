"""Pure tensor math for position schemes, shared by patch-time and run-time code (as timm's pos_embed)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

RESAMPLE_MODES = ("copy", "linear", "cubic")


def resample_table(table: torch.Tensor, rows: int, mode: str) -> torch.Tensor:
    """Return a position table of ``rows`` rows made from ``table`` (rows x dim).

    - ``copy``: the old rows tiled until ``rows`` (Longformer's initialisation). Every position below the
      old length keeps its exact old vector; shrinking keeps the first ``rows`` rows.
    - ``linear`` / ``cubic``: the table resampled along positions (position interpolation). Corners are
      aligned so position 0 keeps its exact vector and new position p reads old position
      p * (old - 1) / (rows - 1), close to Chen et al.'s p * old / rows.
    Same length is the identity for every mode. Math in fp32, result in the table's dtype.
    """
    if mode not in RESAMPLE_MODES:
        raise ValueError(f"mode must be one of {', '.join(RESAMPLE_MODES)}; got {mode!r}.")
    old = table.shape[0]
    if rows == old:
        return table.clone()
    if mode == "copy":
        return table.repeat(math.ceil(rows / old), 1)[:rows].clone()
    if old == 1:
        return table.expand(rows, -1).clone()
    # (rows, dim) -> (1, dim, rows, 1): a one-pixel-wide image, so "bicubic" is cubic along positions.
    image = table.detach().float().t()[None, :, :, None]
    mode_2d = "bilinear" if mode == "linear" else "bicubic"
    resized = F.interpolate(image, size=(rows, 1), mode=mode_2d, align_corners=True)
    return resized[0, :, :, 0].t().to(table.dtype).contiguous()
