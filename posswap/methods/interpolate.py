"""``interpolate``: the learned table grows (or shrinks) to ``max_length`` rows; nothing else changes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ..absolute import replace_table_weight
from ..config import PositionConfig, check_choice, check_positive_int
from ..memory import resampled_table_bytes_per_row
from ..portable.posswap_architectures import Sites
from ..portable.posswap_functional import RESAMPLE_MODES, resample_positions
from ..registry import register_method

logger = logging.getLogger("posswap")


@dataclass
class InterpolateConfig(PositionConfig):
    method = "interpolate"

    mode: str = field(
        default="copy",
        metadata={
            "help": "copy: tile the old rows (Longformer); linear / cubic: resample the table (position interpolation); "
            "stride: old row i at position k*i, k = max_length // old, the rows between interpolated (LongEmbed's "
            "E5-Base-4k)."
        },
    )

    source_length: int | None = field(
        default=None,
        metadata={
            "help": "Resample from the first N rows of the table only (null: all). For a model fine-tuned on shorter "
            "inputs than its table holds, whose later rows it no longer reads well: all-MiniLM-L6-v2 reads 256 of 512."
        },
    )

    def validate(self) -> None:
        super().validate()
        check_choice("mode", self.mode, RESAMPLE_MODES)
        if self.source_length is not None:
            check_positive_int("source_length", self.source_length)

    def bytes_per_row(self, sites: Sites) -> int:
        return resampled_table_bytes_per_row(sites)  # the table resized to max_length


def resized_table_weight(sites: Sites, max_length: int, mode: str, source_length: int | None = None) -> torch.Tensor:
    """The table's new weight for ``max_length`` tokens from its first ``source_length`` real rows (None: all),
    RoBERTa's padding rows kept as they are."""
    weight = sites.table.weight.detach()
    if source_length is not None:
        weight = weight[: sites.offset + source_length]
    return resample_positions(weight, sites.offset, max_length, mode)


def recorded(model: nn.Module) -> dict | None:
    """The config this model was patched with, as ``to_dict`` gives it (None: stock)."""
    block = getattr(model.config, "posswap", None)
    return {k: v for k, v in block.items() if k not in ("original_length", "version")} if block else None


def check(model: nn.Module, sites: Sites, config: InterpolateConfig) -> None:
    if sites.table is None:
        raise ValueError(
            "This model has no learned position table left to interpolate (a method dropped it). "
            "Start from the original checkpoint."
        )
    previous = getattr(model.config, "posswap", None)
    if config.source_length is not None and config.source_length > sites.max_length:
        raise ValueError(
            f"source_length {config.source_length} is more rows than this model's table holds ({sites.max_length}); "
            "give at most that, or null for all of them."
        )
    if previous and recorded(model) != config.to_dict() and config.source_length is not None:
        raise ValueError(
            "source_length resamples the original table, and this one was already extended; start from the "
            "original checkpoint."
        )
    if previous and previous.get("mode") != config.mode:
        # Resampling a table that was already resampled is not the original resampled another way.
        raise ValueError(
            f"This table was already extended with mode {previous.get('mode')!r}; re-patching it with mode "
            f"{config.mode!r} would not give the original table resampled that way. Start from the original checkpoint."
        )


def apply(model: nn.Module, sites: Sites, config: InterpolateConfig) -> None:
    old = sites.max_length
    if recorded(model) == config.to_dict():
        return  # a saved model loaded again: its table is already this config's
    if config.max_length == old and config.source_length in (None, old):
        return
    if config.max_length < old:
        logger.warning(
            "Shrinking the position table from %d to %d tokens: positions past %d are lost.",
            old,
            config.max_length,
            config.max_length,
        )
    replace_table_weight(sites.table, resized_table_weight(sites, config.max_length, config.mode, config.source_length))


register_method(
    InterpolateConfig,
    check,
    apply,
    variants={"copy": {"mode": "copy"}, "linear": {"mode": "linear"}, "cubic": {"mode": "cubic"}},
    extends_table=True,
    runtime=False,
)
