"""``rope`` at run time: queries and keys rotated in every self-attention layer (``posswap_rotary.py``), on the
attention kernel the saved block names.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
from torch import nn

from .posswap_architectures import Sites
from .posswap_attention import PLAIN_IMPLEMENTATIONS
from .posswap_registry import block_check, installer
from .posswap_rotary import install_rotary


@installer("rope")
def install_rope(model: nn.Module, sites: Sites, block: dict) -> None:
    install_rotary(sites.base, sites.self_attentions(), sites.arch.qk_projections, block)
    if block.get("backend"):
        model.set_attn_implementation(PLAIN_IMPLEMENTATIONS[block["backend"]])


@block_check
def rotary_dim_problem(value, block: dict) -> str | None:
    fraction = isinstance(value, float) and 0 < value <= 1
    count = isinstance(value, int) and not isinstance(value, bool) and value > 0 and value % 2 == 0
    return None if fraction or count else "must be a fraction in (0, 1] or an even positive number of dims"


def rotary_map(model: nn.Module, sites: Sites, positions: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Expected cosine similarity of one random head vector rotated to positions i and j: every rotated pair of
    dims turns by (i - j) theta_k, the pairs partial rotary leaves alone stay put (cos 0 = 1). The cos/sin scale
    (YaRN's attention factor) weighs the rotated pairs by scale^2 against the unrotated ones."""
    rotary = sites.base.posswap_rotary
    inv_freq, scale = rotary.frequencies(torch.device("cpu"), rotary.stretched_length(positions))  # as at run time
    distance = (positions[:, None] - positions[None, :]).double()
    rotated = torch.cos(distance[..., None] * inv_freq.double()).sum(-1) * scale**2
    unrotated = (rotary.head_dim - rotary.rotary_dim) / 2
    pairs = len(inv_freq) * scale**2 + unrotated
    title = f"RoPE: mean cos((i-j)θ), {rotary.rotary_dim}/{rotary.head_dim} dims rotated"
    return ((rotated + unrotated) / pairs).float(), title + (f", {rotary.rope_type}" if rotary.rope_type else "")
