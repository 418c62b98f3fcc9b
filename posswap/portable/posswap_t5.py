"""T5's learned relative position bias as a provider for the bias attention family (``posswap_attention.py``).

A per-head bias over log-spaced buckets of the key-minus-query distance, looked up in a small learned table
(``num_buckets`` x heads). The buckets are transformers' own (``T5Attention._relative_position_bucket``):
bidirectional for encoders, causal for decoders.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.models.t5.modeling_t5 import T5Attention

from .posswap_architectures import Sites
from .posswap_attention import BiasProvider, install_bias
from .posswap_registry import block_check, installer

INITS = ("zeros", "fit")  # T5BiasConfig's init: starting biases


def t5_buckets(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """Bucket of each ``key - query`` distance: T5's function, reused as it is."""
    return T5Attention._relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance)


class T5Buckets(BiasProvider):
    """``bias[h, i, j] = table[bucket(j - i), h]``. The table is a parameter (``relative_attention_bias``, as T5
    names it); both paths look distances up in a per-distance copy of it (flex inside the kernel, so it builds no
    (q, k) tensor)."""

    shift_invariant = True

    def __init__(self, num_heads: int, num_buckets: int, max_distance: int, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.relative_attention_bias = nn.Embedding(num_buckets, num_heads)

    @property
    def far_distance(self) -> int | None:
        """A decoder's distances from ``max_distance`` on fall in the last bucket (an encoder's split by side)."""
        return None if self.bidirectional else self.max_distance

    def per_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(heads, 2 * span - 1) fp32 biases, one column per key-minus-query distance from -(span - 1) on, and the
        column of distance 0. The bucket function runs on these few distances, not on every (q, k) pair."""
        # meta: no values to read, so a span that holds any distance of these lengths (shapes only)
        if q_pos.device.type == "meta":
            span = q_pos.shape[-1] + k_pos.shape[-1]
        else:
            span = int(max(q_pos.max(), k_pos.max()) - min(q_pos.min(), k_pos.min())) + 1
        distances = torch.arange(-span + 1, span, device=q_pos.device)
        buckets = t5_buckets(distances, self.bidirectional, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).t().float(), span - 1

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        per_distance, offset = self.per_distance(q_pos, k_pos)
        distance = k_pos[..., None, :] - q_pos[..., :, None] + offset  # (b|1, q, k): memory minus query, as T5
        # Gathered heads-first: (b, h, q, k) is then contiguous for b = 1, as SDPA reads it; a permuted
        # layout would be copied again by every layer's kernel, forward and backward.
        return per_distance[:, distance].movedim(0, 1).contiguous()

    def score_term(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Callable:
        per_distance, offset = self.per_distance(q_pos, k_pos)  # flex: looked up inside the kernel, no (q, k) tensor

        def term(b, h, q_idx, kv_idx):
            return per_distance[h, k_pos[b, kv_idx] - q_pos[b, q_idx] + offset]

        return term

    def extra_repr(self) -> str:
        return f"buckets={self.num_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}"


@installer("t5-bias")
def install_t5_bias(model: nn.Module, sites: Sites, block: dict) -> None:
    # Built with whatever values nn.Embedding starts with: the checkpoint (loading) or init (patching) sets them.
    attentions = sites.self_attentions()
    count = len(attentions) if block.get("per_layer") else 1
    providers = [
        T5Buckets(model.config.num_attention_heads, block["num_buckets"], block["max_distance"], not sites.arch.causal)
        for _ in range(count)
    ]
    install_bias(model, sites.base, attentions, providers, block.get("backend") or "sdpa", sites.offset)


@block_check
def max_distance_problem(value, block: dict) -> str | None:
    """T5's bucket function divides by log(max_distance / max_exact), max_exact = num_buckets / 4 (encoders) or
    / 2: max_distance must pass half the buckets."""
    buckets = block.get("num_buckets")
    floor = buckets // 2 if isinstance(buckets, int) and not isinstance(buckets, bool) else 0
    ok = isinstance(value, int) and not isinstance(value, bool) and value > floor
    return None if ok else f"must be an integer > {floor}"
