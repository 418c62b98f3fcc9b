"""Where ``backend="flex"`` runs flex attention, and where it runs the same attention through SDPA instead.

On CUDA, flex attention (one Triton kernel, the bias made inside it by ``score_mod``). On CPU, SDPA with the same
mask and the same bias: torch 2.13's compiled CPU flex kernel (inductor's C++ template) is not exact on every x86
CPU. On an AVX2 CPU without AVX-512 it returns NaN for whole rows, unpadded ones included, at some shapes and after
a recompile at a new shape (the first call at (2, 40) with a padded row NaN, the second finite; (2, 24) NaN), and a
recompile for dynamic shapes fails to build (CppCompileError, ``cur_qSplitSize2 was not declared``). A model's
output must not depend on the CPU that runs it, so on CPU the mask is the one SDPA takes (``sdpa_mask``) and the
attention is posswap's SDPA path, exact to fp32 against eager everywhere; flex has no backward on CPU either, and
its compiled CPU forward ran 2.5-3.5x SDPA's time here. ``tests/test_flex_route.py`` checks every row against eager
at several shapes and padding patterns in one process.

It travels with saved models (``posswap/portable``), so it imports nothing from the posswap package.
"""

from __future__ import annotations

import torch
from transformers.integrations.flex_attention import flex_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import flex_attention_mask, sdpa_mask


def runs_flex(device: torch.device | str) -> bool:
    """Does ``backend="flex"`` run flex attention on this device? Everywhere but the CPU."""
    return torch.device(device).type != "cpu"


def refuse_dropout(dropout: float) -> None:
    """flex attention has no attention dropout: refused on every device, so a model refuses the same on CPU."""
    if dropout > 0:
        raise ValueError(
            "Backend 'flex' has no attention dropout. Set the model's attention dropout to 0 "
            "(attn_pdrop / attention_probs_dropout_prob), call model.eval(), or patch with backend='sdpa'."
        )


def flex_or_sdpa_mask(*args, device: torch.device | str = "cpu", **kwargs):
    """The mask function of posswap's flex kernels: flex's BlockMask where flex runs, SDPA's mask on CPU."""
    if runs_flex(device):
        return flex_attention_mask(*args, device=device, **kwargs)
    return sdpa_mask(*args, device=device, **kwargs)


def plain_flex_attention(module, query, key, value, attention_mask, dropout: float = 0.0, **kwargs):
    """transformers' flex attention (RoPE's ``backend="flex"``), or on CPU its SDPA attention with the same mask."""
    refuse_dropout(dropout)
    if runs_flex(query.device):
        return flex_attention_forward(module, query, key, value, attention_mask, **kwargs)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
