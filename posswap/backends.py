"""Which attention kernel a patched model runs: the ``backend`` option of RoPE and ALiBi.

transformers 5 refuses ``attn_implementation="flex_attention"`` for GPT-2, so posswap registers
transformers' own flex attention function and flex mask under its own name, which any model can use.
"""

from __future__ import annotations

from torch import nn
from transformers import AttentionInterface
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask

BACKENDS = (None, "sdpa", "flex", "eager")
FLEX = "posswap_flex"

AttentionInterface.register(FLEX, flex_attention_forward)
AttentionMaskInterface.register(FLEX, flex_attention_mask)  # without it no mask is built


def _implementation(backend: str) -> str:
    return {"sdpa": "sdpa", "eager": "eager", "flex": FLEX}[backend]


def check_backend(model: nn.Module, sites, backend: str | None) -> None:
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
