"""``interpolate``: the learned table grows (or shrinks) to ``max_length`` rows; nothing else changes."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import PositionConfig
from ..memory import resampled_table_bytes_per_row
from ..portable.posswap_architectures import Sites
from ..portable.posswap_functional import RESAMPLE_MODES, resample_positions
from ..portable.posswap_interpolate import learned_map
from ..portable.posswap_rules import check as check_rule
from ..portable.posswap_rules import choice
from ..registry import register_method
from .absolute import replace_table_weight

logger = logging.getLogger("posswap")


@dataclass
class InterpolateConfig(PositionConfig):
    method = "interpolate"

    mode: str = field(
        default="copy",
        metadata={
            "help": "How the learned table grows to max_length: copy (tile the old rows, Longformer), linear or cubic "
            "(resample it: position interpolation), stride (old row i at position k*i, k = max_length // old, the rows "
            "between interpolated: LongEmbed's E5-Base-4k), hierarchical (position p reads old row p % old plus a vector "
            "for its block p // old: neighbours keep their exact old distances at every length; Su 2020).",
            "rule": choice(*RESAMPLE_MODES),
        },
    )

    exact_short_inputs: bool = field(
        default=False,
        metadata={
            "help": "With mode stride, an input within the original length reads exactly the original rows (its "
            "position ids multiplied by k, as E5-Base-4k; explicit position_ids too, where a row's all lie within "
            "the original length), so the patched model gives it the original's outputs. Encoders only; saved "
            "folders then carry posswap's code.",
            "rule": check_rule("exact_short_inputs_problem"),  # portable/posswap_interpolate.py: needs mode stride
        },
    )

    stride_per_length: bool = field(
        default=False,
        metadata={
            "help": "With exact_short_inputs, an input longer than the original length is read at the widest whole "
            "step its length leaves room for (max_length // its tokens, at most k) instead of every position: a "
            "1024-token input of a 2048-token model at every second position, so each old row spans k tokens at "
            "every length. Explicit position_ids too, by their largest.",
            "rule": check_rule("stride_per_length_problem", optional=True),  # portable/posswap_interpolate.py
        },
    )

    stride_blocks: int = field(
        default=1,
        metadata={
            "help": "With mode stride, the table in this many blocks of max_length / stride_blocks rows, each the "
            "stride table of that length and each after the first plus a coarse block vector (hierarchical's): a "
            "2048-token model in 2 blocks reads neighbours half an old position apart, not a quarter.",
            "rule": check_rule("stride_blocks_problem", optional=True),  # portable/posswap_interpolate.py
        },
    )

    def bytes_per_row(self, sites: Sites) -> int:
        return resampled_table_bytes_per_row(sites)  # the table resized to max_length


def resized_table_weight(sites: Sites, max_length: int, mode: str, blocks: int = 1) -> torch.Tensor:
    """The table's new weight for ``max_length`` tokens (RoBERTa's padding rows kept as they are)."""
    return resample_positions(sites.table.weight.detach(), sites.table_offset, max_length, mode, blocks)


def check(model: nn.Module, sites: Sites, config: InterpolateConfig) -> None:
    if config.exact_short_inputs:
        check_exact_short_inputs(model, sites, config)
    if sites.table is None:
        raise ValueError(
            "This model has no learned position table left to interpolate (a method dropped it). "
            "Start from the original checkpoint."
        )
    previous = getattr(model.config, "posswap", None)
    if previous and (previous.get("stride_blocks") or 1) > 1:
        # Its old rows no longer sit at k*i across the table: a stride over it would misplace short inputs.
        raise ValueError(
            f"This table was laid out in {previous['stride_blocks']} stride blocks; re-patching it would not give "
            "the original table laid out again. Start from the original checkpoint."
        )
    if previous and previous.get("mode") != config.mode:
        # Resampling a table that was already resampled is not the original resampled another way.
        raise ValueError(
            f"This table was already extended with mode {previous.get('mode')!r}; re-patching it with mode "
            f"{config.mode!r} would not give the original table resampled that way. Start from the original checkpoint."
        )


def check_exact_short_inputs(model: nn.Module, sites: Sites, config: InterpolateConfig) -> None:
    if sites.arch.causal:
        # A decoder's positions grow during generation: a prompt would move rows as it crosses the old length.
        raise ValueError(
            "exact_short_inputs is for encoders (BERT, RoBERTa, ...): a decoder's tokens would change position "
            f"as generation crosses the original length. Patch this {sites.arch.model_type} without it."
        )
    previous = getattr(model.config, "posswap", None)
    original = previous["original_length"] if previous else sites.max_length
    # Old row i sits at k*i only if every stride so far was a whole number (2048 -> 4096 after 512 -> 2048).
    length = config.max_length // (config.stride_blocks or 1)  # one block's stride table
    if length % sites.max_length or sites.max_length % original or length < 2 * original:
        raise ValueError(
            f"exact_short_inputs needs max_length / stride_blocks a multiple (2x or more) of the original length "
            f"{original} and of the current one {sites.max_length}, so that old row i sits at position k*i; got "
            f"{length}."
        )


def apply(model: nn.Module, sites: Sites, config: InterpolateConfig) -> None:
    old = sites.max_length
    if config.max_length == old:
        return
    if config.max_length < old:
        logger.warning(
            "Shrinking the position table from %d to %d tokens: positions past %d are lost.",
            old,
            config.max_length,
            config.max_length,
        )
    blocks = config.stride_blocks or 1
    replace_table_weight(sites.table, resized_table_weight(sites, config.max_length, config.mode, blocks))


def export_refusal(block: dict) -> str:
    """A resized table is native already; only exact_short_inputs runs code, which no native model has."""
    if block.get("exact_short_inputs"):
        return (
            "exact_short_inputs reads an input within the original length at positions k*i, which no native "
            "architecture does"
        )
    return "the resized table is native already"


register_method(
    InterpolateConfig,
    check,
    apply,
    variants={"copy": {"mode": "copy"}, "linear": {"mode": "linear"}, "cubic": {"mode": "cubic"}},
    extends_table=True,
    position_map=learned_map,
    example=lambda n: InterpolateConfig(max_length=n, mode="linear"),
    export_refusal=export_refusal,
)
