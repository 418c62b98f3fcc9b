"""Which attention kernel a patched model runs: the ``backend`` option of RoPE and ALiBi.

transformers 5 refuses ``attn_implementation="flex_attention"`` for GPT-2, so posswap registers
transformers' own flex attention function and flex mask under its own name, which any model can use.
"""

from __future__ import annotations

from torch import nn
from transformers import AttentionInterface
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask

from .config import check_choice

BACKENDS = ("sdpa", "flex", "eager")  # the `backend` of RopeConfig and AlibiConfig; None: as loaded
FLEX = "posswap_flex"

AttentionInterface.register(FLEX, flex_attention_forward)
AttentionMaskInterface.register(FLEX, flex_attention_mask)  # without it no mask is built


def _implementation(backend: str) -> str:
    return {"sdpa": "sdpa", "eager": "eager", "flex": FLEX}[backend]


def validate_backend(backend: str | None) -> None:
    if backend is not None:
        check_choice("backend", backend, BACKENDS)


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


def select_backend(model: nn.Module, backend: str | None) -> None:
    if backend is not None:
        model.set_attn_implementation(_implementation(backend))
