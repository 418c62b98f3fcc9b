"""``sinusoidal`` at run time: the learned table's place taken by the fixed sin/cos table
(``posswap_tables.SinusoidalPositions``), with the theta and scale the saved block records.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
from torch import nn

from .posswap_architectures import Sites
from .posswap_functional import cosine_matrix
from .posswap_registry import installer
from .posswap_tables import SinusoidalPositions


@installer("sinusoidal")
def install_sinusoidal(model: nn.Module, sites: Sites, block: dict) -> None:
    dim, rows = sites.table_dim, model.config.max_position_embeddings
    like = sites.base.get_input_embeddings().weight  # the dtype and device the rows are returned in
    rows += sites.arch.inner_offset  # OPT's and BART's tables: 2 rows before position 0 that the config omits
    theta, scale = float(block["theta"]), float(block["scale"])
    table = SinusoidalPositions(dim, rows, sites.table_offset, theta, scale, like, sites.arch.inner_offset)
    setattr(sites.owner, sites.arch.table, table)


def sinusoidal_map(model: nn.Module, sites: Sites, positions: torch.Tensor) -> tuple[torch.Tensor, str]:
    device = next(model.parameters()).device
    table = getattr(sites.owner, sites.arch.table).table(device)  # row p is position p - offset
    return cosine_matrix(table[positions + sites.table_offset].cpu()), "sinusoidal table: cosine of rows"
