"""Which attention kernel a patched model runs: the ``backend`` option of RoPE and ALiBi.

The kernels themselves are registered in ``portable/posswap_attention.py`` (``posswap_flex`` is transformers'
own flex attention under a name GPT-2 accepts), with ``BACKENDS``, the choices; this checks that a model can run
the kernel chosen before anything changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field

from torch import nn

from ..portable.posswap_architectures import Sites
from ..portable.posswap_attention import BACKENDS, BIAS_IMPLEMENTATIONS
from ..portable.posswap_rules import choice

# The help of the ``backend`` option, one text for every method that has it (one name, one meaning).
BACKEND_HELP = (
    "Attention kernel: sdpa, flex (flex attention on a GPU; on CPU the sdpa path, exact on every CPU) or eager; "
    "default: what the model was loaded with."
)


def backend_field():
    """The ``backend`` option of every method that runs its own attention (RoPE, ALiBi, T5 bias, TUPE): declared
    once."""
    return field(default=None, metadata={"help": BACKEND_HELP, "rule": choice(*BACKENDS, optional=True)})


def installs_attention(config_class: type) -> bool:
    """Whether a method installs its own attention kernel: the methods with the ``backend`` option."""
    return any(f.name == "backend" for f in dataclasses.fields(config_class))


def check_attention_interface(sites: Sites, method: str) -> None:
    """Before patching a method that installs its own attention kernel (the first check of each): the family's
    attention goes through transformers' attention interface, where the kernel is installed
    (``Architecture.own_attention`` says why not)."""
    why = sites.arch.own_attention
    if why:
        raise ValueError(
            f"posswap cannot patch {sites.arch.model_type} ({type(sites.model).__name__}) with {method}: {why}, so "
            "posswap's attention kernels cannot be installed. Use interpolate instead (mode='stride' with "
            "exact_short_inputs=True keeps inputs within the original length exact)."
        )


def check_backend(model: nn.Module, backend: str | None) -> None:
    """Before patching: can this model run ``backend``?"""
    if backend is None:
        return
    if backend == "flex":
        from transformers.utils import is_torch_flex_attn_available

        if not is_torch_flex_attn_available():
            raise ValueError("backend='flex' needs torch's flex_attention (torch >= 2.5); use 'sdpa'.")
    if not model._can_set_attn_implementation():
        raise ValueError(f"{type(model).__name__} cannot switch its attention implementation; leave backend unset.")


def resolve_bias_backend(model: nn.Module, backend: str | None) -> str:
    """The kernel of a bias method (ALiBi, ...): the one asked for, else the one the model runs now (flash
    kernels take no per-head bias here, so they fall back to sdpa)."""
    if backend is not None:
        return backend
    current = model.config._attn_implementation
    for name, implementation in BIAS_IMPLEMENTATIONS.items():
        if current == implementation:  # patched again: keep the kernel
            return name
    if current == "eager":
        return "eager"
    return "flex" if current and "flex" in current else "sdpa"


def check_bias_backend(model: nn.Module, backend: str | None) -> None:
    """Before patching a bias method: the kernel it resolves to runs here, and transformers accepts it."""
    resolved = resolve_bias_backend(model, backend)
    check_backend(model, resolved)
    model.get_correct_attn_implementation(BIAS_IMPLEMENTATIONS[resolved])  # raises ValueError if refused
