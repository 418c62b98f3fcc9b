"""``alibi``: attention with linear biases (Press et al.) in every self-attention layer, in place of (or on
top of) the learned table. The bias is added by posswap's attention functions
(``portable/posswap_attention.py``, carried by saved models), registered with transformers' interfaces."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..architectures import Sites
from ..absolute import ABSOLUTE_CHOICES, check_absolute, keep_table, planned_table_weight
from ..backends import check_backend, validate_backend
from ..config import PositionConfig, check_choice
from ..portable.posswap_attention import ALIBI_IMPLEMENTATIONS
from ..registry import register_method

@dataclass
class AlibiConfig(PositionConfig):
    method = "alibi"

    symmetric: bool | None = field(
        default=None,
        metadata={"help": "ALiBi bias -m*|i-j| (true) or causal -m*(i-j) (false); default: symmetric for encoders, causal for GPT-2."},
    )
    absolute: str = field(
        default="drop",
        metadata={"help": "drop: remove the learned position table (default); keep: keep it, extended by copying rows."},
    )
    backend: str | None = field(
        default=None,
        metadata={"help": "ALiBi attention kernel: sdpa, flex or eager; default: what the model was loaded with."},
    )

    def validate(self) -> None:
        super().validate()
        if self.symmetric is not None and not isinstance(self.symmetric, bool):
            raise ValueError(f"symmetric must be true, false or None (from the architecture); got {self.symmetric!r}.")
        check_choice("absolute", self.absolute, ABSOLUTE_CHOICES)
        validate_backend(self.backend)


def resolve_backend(model: nn.Module, config: AlibiConfig) -> str:
    if config.backend is not None:
        return config.backend
    current = model.config._attn_implementation
    for backend, name in ALIBI_IMPLEMENTATIONS.items():
        if current == name:  # patched again: keep the kernel
            return backend
    if current == "eager":
        return "eager"
    return "flex" if current and "flex" in current else "sdpa"  # flash kernels have no per-head bias here


def check(model: nn.Module, sites: Sites, config: AlibiConfig) -> None:
    if config.symmetric is False and not sites.arch.causal:
        raise ValueError(
            f"symmetric=False (the causal bias -m*(i-j)) needs a causal model; {sites.arch.model_type} attends both "
            "ways. Leave symmetric unset (or true) for encoders."
        )
    check_absolute(sites, config.absolute)
    check_backend(model, resolve_backend(model, config))
    # Raises (ValueError) if transformers would refuse the implementation for this model.
    model.get_correct_attn_implementation(ALIBI_IMPLEMENTATIONS[resolve_backend(model, config)])


def apply(model: nn.Module, sites: Sites, config: AlibiConfig) -> None:
    """The weight change only (a kept table grows by copy); posswap.patch then installs the bias
    (``portable/posswap_attention.py``), as a saved model's own class does when it is built."""
    keep_table(sites, planned_table_weight(sites, config.absolute, config.max_length))
    # Recorded in the saved posswap block so that a loaded model picks the same kernel.
    config.backend = resolve_backend(model, config)


register_method(AlibiConfig, check, apply)
