"""What RoPE and ALiBi do with the learned table they replace: ``drop`` it or ``keep`` it (extended).

Dropping happens at run time (``portable/posswap_runtime.py``: saved models drop it again when built);
keeping an extended table is a weight change, made here. The table math lives in functional.py."""

from __future__ import annotations

from dataclasses import field

import torch
from torch import nn

from ..config import check_choice
from ..portable.posswap_architectures import Sites
from ..portable.posswap_functional import resample_positions
from ..portable.posswap_rules import choice
from ..portable.posswap_tables import ABSOLUTE_CHOICES

# The help of the ``absolute`` option, one text for every method that has it (one name, one meaning).
ABSOLUTE_HELP = "The learned position table: drop (remove it; default) or keep (keep it, extended by copying rows)."


def absolute_field():
    """The ``absolute`` option of every method that may keep the table (RoPE, ALiBi, T5 bias): declared once."""
    return field(default="drop", metadata={"help": ABSOLUTE_HELP, "rule": choice(*ABSOLUTE_CHOICES)})


def check_absolute(sites: Sites, absolute: str) -> None:
    check_choice("absolute", absolute, ABSOLUTE_CHOICES)
    if absolute == "keep" and sites.table is None:
        raise ValueError(
            "absolute='keep' needs the learned position table, but this model has none left (it was dropped). "
            "Use absolute='drop' or start from the original checkpoint."
        )


def planned_table_weight(sites: Sites, absolute: str, max_length: int) -> torch.Tensor | None:
    """For 'keep': the table extended by copy (old positions keep their vectors). Built before any change."""
    if absolute == "keep" and max_length != sites.max_length:
        return resample_positions(sites.table.weight.detach(), sites.table_offset, max_length, "copy")
    return None


def replace_table_weight(table: nn.Embedding, weight: torch.Tensor) -> None:
    table.weight = nn.Parameter(weight, requires_grad=table.weight.requires_grad)
    table.num_embeddings = weight.shape[0]


def keep_table(sites: Sites, new_weight: torch.Tensor | None) -> None:
    if new_weight is not None:
        replace_table_weight(sites.table, new_weight)
