"""``rope``: rotary position embedding on queries and keys of every self-attention layer.

The config and its checks live here; the rotation itself is run-time code that saved models carry
(``portable/posswap_rotary.py``): keys are rotated as the projection produces them, before the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import PositionConfig
from ..portable.posswap_architectures import Sites
from ..portable.posswap_rope import rotary_map
from ..portable.posswap_rotary import ROPE_INITS, ROPE_TYPES, resolve_rotary_dim
from ..portable.posswap_rules import check as check_rule
from ..portable.posswap_rules import choice, number
from ..registry import register_method
from .absolute import absolute_field, check_absolute, keep_table, planned_table_weight
from .backends import backend_field, check_attention_interface, check_backend
from .rope_fit import fit_rotary_biases
from .table_logits import original_rows


@dataclass
class RopeConfig(PositionConfig):
    method = "rope"

    theta: float = field(
        default=10000.0,
        metadata={
            "help": "Frequency base: rotation frequency i of d/2 is theta^(-2i/d) rad per position (transformers' "
            "rope_theta).",
            "rule": number(above=1),
        },
    )
    rotary_dim: float | int | None = field(
        default=None,
        metadata={
            "help": "Head dims rotated: a fraction in (0, 1] or an even number of dims; default all.",
            "rule": check_rule("rotary_dim_problem", optional=True),  # portable/posswap_rope.py
        },
    )
    rope_type: str | None = field(
        default=None,
        metadata={
            "help": "RoPE scaling type: None, linear, dynamic or yarn (transformers' rope_type).",
            "rule": choice(*ROPE_TYPES),
        },
    )
    factor: float | None = field(
        default=None,
        metadata={
            "help": "Scaling factor of rope_type; default max_length / the model's original length.",
            "rule": number(minimum=1, optional=True),
        },
    )
    absolute: str = absolute_field()
    backend: str | None = backend_field()
    init: str | None = field(
        default=None,
        metadata={
            "help": "How the new position parameters start: fit (first-layer q/k biases whose rotation rebuilds "
            "the dropped table's position-position logits per distance; absolute=drop only); default: the weights as they are.",
            "rule": choice(*ROPE_INITS, optional=True),
        },
    )

    def validate(self) -> None:
        super().validate()
        if self.factor is not None and self.rope_type is None:
            raise ValueError(
                "factor only applies with rope_type='linear', 'dynamic' or 'yarn'; set rope_type or drop factor."
            )
        if self.init == "fit" and self.absolute == "keep":
            raise ValueError(
                "init='fit' rebuilds what the dropped table did; with absolute='keep' the table still does it. "
                "Use absolute='drop' with init='fit', or leave init unset."
            )


def check(model: nn.Module, sites: Sites, config: RopeConfig) -> None:
    check_attention_interface(sites, config.method)
    check_absolute(sites, config.absolute)
    check_backend(model, config.backend)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    resolve_rotary_dim(config.rotary_dim, head_dim)
    if config.init == "fit" and sites.table is None:
        raise ValueError(
            "init='fit' fits the rotation to the learned position table, but this model has none left. Leave init unset."
        )


def apply(model: nn.Module, sites: Sites, config: RopeConfig) -> torch.Tensor | None:
    """The weight change only (a kept table grows by copy); posswap.patch then installs the rotation
    (``portable/posswap_rotary.py``), as a saved model's own class does when it is built. Returns the original
    table rows for ``init="fit"``."""
    rows = original_rows(model, sites) if config.init == "fit" else None
    keep_table(sites, planned_table_weight(sites, config.absolute, config.max_length))
    return rows


def initialize(model: nn.Module, sites: Sites, config: RopeConfig, rows: torch.Tensor | None) -> None:
    if rows is not None:
        fit_rotary_biases(model, sites, rows)


def export_refusal(block: dict) -> str | None:
    """Why ``posswap export`` has no exact native copy (GPT-NeoX, RoFormer) of a model patched as ``block``."""
    if block.get("absolute", "drop") == "keep":
        return "absolute='keep' adds the learned table to RoPE, which no native rotary architecture has"
    if block.get("rope_type") == "dynamic":
        return "dynamic scaling is not exact in transformers (it caches the stretched frequencies)"
    return None


# rope-yarn: YaRN stretched by the study's extension (4x).
register_method(
    RopeConfig,
    check,
    apply,
    initialize,
    variants={"rope": {}, "rope-yarn": {"rope_type": "yarn"}},
    position_map=rotary_map,
    example=lambda n: RopeConfig(max_length=n),
    export_refusal=export_refusal,  # RoPE's native export (posswap/export.py), where the config allows it
)
