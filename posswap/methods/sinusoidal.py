"""``sinusoidal``: the learned table is replaced by the fixed sin/cos table of the original Transformer, scaled
to the learned table's size. The table itself is run-time code that saved models carry
(``portable/posswap_tables.py``); the math is ``sinusoidal_table`` in ``portable/posswap_functional.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..config import PositionConfig
from ..portable.posswap_architectures import Sites
from ..portable.posswap_functional import sinusoidal_table
from ..portable.posswap_rules import number
from ..portable.posswap_sinusoidal import sinusoidal_map
from ..registry import register_method


@dataclass
class SinusoidalConfig(PositionConfig):
    method = "sinusoidal"

    theta: float = field(
        default=10000.0,
        metadata={
            "help": "Frequency base: dims 2i and 2i+1 turn at theta^(-2i/d) rad per position, as RoPE's theta.",
            "rule": number(above=1, required=True),
        },
    )
    scale: str | float = field(
        default="match",
        metadata={
            "help": "match: scale the table to the RMS of the learned table it replaces (recorded as a number); "
            "or a number to multiply the unit sin/cos table by.",
            "rule": number(above=0, required=True, before_apply=("match",)),
        },
    )

    def bytes_per_row(self, sites: Sites) -> int:
        # The sinusoid is made on first use: float64 angles, sin, cos and table, then float32 copies (scaled,
        # indexed); about 32 bytes a value at the peak.
        return sites.table_dim * 32


def rms(table) -> float:
    return table.double().pow(2).mean().sqrt().item()


def check(model: nn.Module, sites: Sites, config: SinusoidalConfig) -> None:
    if config.scale == "match" and sites.table is None:
        previous = getattr(model.config, "posswap", None) or {}
        hint = (
            f" (this model's sinusoid has scale={previous['scale']})" if previous.get("method") == "sinusoidal" else ""
        )
        raise ValueError(
            "scale='match' measures the learned position table, but this model has none left (a method replaced it). "
            f"Give scale as a number{hint}, or start from the original checkpoint."
        )


def apply(model: nn.Module, sites: Sites, config: SinusoidalConfig) -> None:
    """No weight change (posswap.patch then swaps the table for the sinusoid); only the scale is resolved, and
    recorded in the saved block, so that a saved model rebuilds the same table without the learned one."""
    if config.scale == "match":
        learned = sites.table.weight.detach()[sites.table_offset :]  # real positions only, not RoBERTa's padding rows
        # Over the positions the model knew, the sinusoid then has the learned table's RMS.
        config.scale = rms(learned) / rms(sinusoidal_table(learned.shape[0], learned.shape[1], config.theta))
    config.scale = float(config.scale)


register_method(
    SinusoidalConfig,
    check,
    apply,
    variants={"sinusoidal": {}},
    position_map=sinusoidal_map,
    example=lambda n: SinusoidalConfig(max_length=n),
)
