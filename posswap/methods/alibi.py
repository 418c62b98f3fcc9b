"""``alibi``: attention with linear biases (Press et al.) in every self-attention layer, in place of (or on
top of) the learned table. The bias is added by posswap's bias attention family
(``portable/posswap_attention.py``) from the provider in ``portable/posswap_alibi.py``; saved models carry both."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..config import PositionConfig
from ..portable.posswap_architectures import Sites
from ..portable.posswap_attention import bias_map
from ..portable.posswap_rules import boolean
from ..registry import register_method
from .absolute import absolute_field, check_absolute, keep_table, planned_table_weight
from .backends import backend_field, check_attention_interface, check_bias_backend, resolve_bias_backend


@dataclass
class AlibiConfig(PositionConfig):
    method = "alibi"

    symmetric: bool | None = field(
        default=None,
        metadata={
            "help": "ALiBi bias -m*|i-j| (true) or causal -m*(i-j) (false); default: symmetric for encoders, causal for GPT-2.",
            "rule": boolean(optional=True),
        },
    )
    absolute: str = absolute_field()
    backend: str | None = backend_field()


def check(model: nn.Module, sites: Sites, config: AlibiConfig) -> None:
    check_attention_interface(sites, config.method)
    if config.symmetric is False and not sites.arch.causal:
        raise ValueError(
            f"symmetric=False (the causal bias -m*(i-j)) needs a causal model; {sites.arch.model_type} attends both "
            "ways. Leave symmetric unset (or true) for encoders."
        )
    check_absolute(sites, config.absolute)
    check_bias_backend(model, config.backend)


def apply(model: nn.Module, sites: Sites, config: AlibiConfig) -> None:
    """The weight change only (a kept table grows by copy); posswap.patch then installs the bias
    (``portable/posswap_attention.py``), as a saved model's own class does when it is built."""
    keep_table(sites, planned_table_weight(sites, config.absolute, config.max_length))
    # Recorded in the saved posswap block so that a loaded model picks the same kernel.
    config.backend = resolve_bias_backend(model, config.backend)


register_method(
    AlibiConfig,
    check,
    apply,
    variants={"alibi": {}},
    position_map=bias_map,
    example=lambda n: AlibiConfig(max_length=n),
)
