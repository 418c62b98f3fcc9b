"""``nope`` at run time: no positions. ``posswap_runtime.install_positions`` has already dropped the table;
nothing takes its place (the model still runs posswap's code: plain transformers would rebuild the table).

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
from torch import nn

from .posswap_architectures import Sites
from .posswap_registry import installer


@installer("nope")
def install_nope(model: nn.Module, sites: Sites, block: dict) -> None:
    """Nothing to add."""


def no_map(model: nn.Module, sites: Sites, positions: torch.Tensor) -> None:
    """The model has no position representation to draw."""
