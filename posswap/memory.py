"""Refuse a patch whose position-sized tensors cannot fit in memory, before any of them is allocated: a
max_length of 10**9 would otherwise fill the machine (or be killed by the OS) instead of failing clearly."""

from __future__ import annotations

import torch
from torch import nn

from .config import PositionConfig
from .portable.posswap_architectures import POSITION_SIZED_BUFFERS, Sites, find_sites

# Resampling holds the old table in fp32, the resized fp32 image and the result at once.
RESAMPLE_COPIES = 3
# Share of the free memory a patch may take: the model still has to run (and train) afterwards.
HEADROOM = 0.5


def patch_bytes(model: nn.Module, config: PositionConfig, sites: Sites | None = None, stacks: int = 1) -> int:
    """About how many bytes patching ``model`` to ``config`` allocates: the position-sized buffers, a kept
    (``absolute="keep"``) table extended by copy, and what the method itself says it builds per row
    (``config.bytes_per_row``: a resampled table, a sinusoid), for each of ``stacks`` (BART's two tables); plus
    GPT-Neo's (rows, rows) causal mask in every layer. ``sites``: the model's, where the caller has them."""
    sites = sites or find_sites(model)
    rows = config.max_length + sites.offset
    per_row = sum(
        b.element_size() for b in (getattr(sites.owner, n, None) for n in POSITION_SIZED_BUFFERS) if b is not None
    )
    if getattr(config, "absolute", None) == "keep":
        per_row += resampled_table_bytes_per_row(sites)
    masks = rows * rows * len(sites.self_attentions()) if sites.arch.attention_buffers else 0  # torch.bool
    return stacks * rows * (per_row + config.bytes_per_row(sites)) + masks


def resampled_table_bytes_per_row(sites) -> int:
    """Bytes per new row of resizing the learned table (0 when it was dropped)."""
    table = sites.table
    return 0 if table is None else table.embedding_dim * max(table.weight.element_size(), 4) * RESAMPLE_COPIES


def free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil  # an accelerate dependency

    return psutil.virtual_memory().available


def check_patch_fits(model: nn.Module, config: PositionConfig, sites: Sites | None = None, stacks: int = 1) -> None:
    """Raise ``ValueError`` naming max_length when the patch would need more memory than is free."""
    device = next(model.parameters()).device
    if device.type == "meta":
        return
    needed, free = patch_bytes(model, config, sites, stacks), free_bytes(device)
    if needed > free * HEADROOM:
        raise ValueError(
            f"max_length {config.max_length} needs about {needed / 2**30:.1f} GiB for the position table and buffers, "
            f"and only {free / 2**30:.1f} GiB of {device.type} memory is free (a patch may take half): choose a smaller max_length."
        )
