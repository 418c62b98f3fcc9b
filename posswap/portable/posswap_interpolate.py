"""``interpolate`` at run time: the resized table is a weight, so only E5-Base-4k's placement of short inputs
(``exact_short_inputs``, ``posswap_placement.py``) runs; a plain resize needs no code of posswap's.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
from torch import nn

from .posswap_architectures import Sites
from .posswap_functional import cosine_matrix
from .posswap_placement import install_short_input_positions
from .posswap_registry import block_check, installer


@installer("interpolate", keeps_table=True, runtime_code=lambda block: bool(block.get("exact_short_inputs")))
def install_interpolate(model: nn.Module, sites: Sites, block: dict) -> None:
    if block.get("exact_short_inputs"):
        install_short_input_positions(sites.base, sites.offset)


@block_check
def exact_short_inputs_problem(value, block: dict) -> str | None:
    if not isinstance(value, bool):
        return "must be true or false"
    if value and block.get("mode") != "stride":
        return f"needs mode 'stride' (the old rows at every k-th position), not mode {block.get('mode')!r}"
    return None


@block_check
def stride_per_length_problem(value, block: dict) -> str | None:
    if not isinstance(value, bool):
        return "must be true or false"
    if value and not block.get("exact_short_inputs"):
        return "needs exact_short_inputs (the placement that reads an input's position ids at a step)"
    return None


@block_check
def stride_blocks_problem(value, block: dict) -> str | None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        return "must be a whole number, 1 or more"
    if value > 1 and block.get("mode") != "stride":
        return f"needs mode 'stride' (each block a stride table), not mode {block.get('mode')!r}"
    if value > 1 and block.get("max_length", 0) % value:
        return f"must divide max_length {block.get('max_length')} into blocks of equal length"
    return None


def learned_map(model: nn.Module, sites: Sites, positions: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The learned table's rows at ``positions``: the cosine of each pair."""
    rows = sites.table.weight.detach()[sites.table_offset : sites.table_offset + sites.max_length].cpu()
    return cosine_matrix(rows[positions]), "learned table: cosine of rows"
