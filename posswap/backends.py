"""Which attention kernel a patched model runs: the ``backend`` option of RoPE and ALiBi.

The kernels themselves are registered in ``portable/posswap_attention.py`` (``posswap_flex`` is transformers'
own flex attention under a name GPT-2 accepts); this checks a choice before anything changes.
"""

from __future__ import annotations

from torch import nn

from .config import check_choice
from .portable.posswap_attention import PLAIN_IMPLEMENTATIONS

BACKENDS = tuple(PLAIN_IMPLEMENTATIONS)  # the `backend` of RopeConfig and AlibiConfig; None: as loaded


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
