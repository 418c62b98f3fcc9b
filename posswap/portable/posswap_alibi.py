"""ALiBi's bias provider for the attention family of ``posswap_attention.py``.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .posswap_architectures import Sites
from .posswap_attention import BiasProvider, install_bias
from .posswap_functional import alibi_bias, alibi_slopes, alibi_term
from .posswap_registry import installer


class AlibiBias(BiasProvider):
    """ALiBi (Press et al.): ``-m_h * (i - j)``, or ``-m_h * |i - j|`` for encoders. Slopes in fp32, made per
    device on first use: never a buffer, so neither the meta device of transformers' loading nor
    ``model.to(torch.bfloat16)`` touches them."""

    shift_invariant = True

    def __init__(self, num_heads: int, symmetric: bool):
        super().__init__()
        self.num_heads, self.symmetric = num_heads, symmetric
        self._slopes: dict[torch.device, torch.Tensor] = {}

    def slopes(self, device) -> torch.Tensor:
        device = torch.device(device)
        if device not in self._slopes:
            self._slopes[device] = alibi_slopes(self.num_heads).to(device)
        return self._slopes[device]

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return alibi_bias(self.slopes(q_pos.device), q_pos, k_pos, self.symmetric)

    def score_term(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Callable:
        slopes, symmetric = self.slopes(q_pos.device), self.symmetric

        def term(b, h, q_idx, kv_idx):
            return alibi_term(slopes[h], q_pos[b, q_idx] - k_pos[b, kv_idx], symmetric)

        return term

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, symmetric={self.symmetric}"


@installer("alibi")
def install_alibi(model: nn.Module, sites: Sites, block: dict) -> None:
    symmetric = block.get("symmetric")
    symmetric = (not sites.arch.causal) if symmetric is None else symmetric
    provider = AlibiBias(model.config.num_attention_heads, symmetric)
    install_bias(model, sites.base, sites.self_attentions(), [provider], block.get("backend") or "sdpa", sites.offset)
