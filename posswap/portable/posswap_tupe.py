"""TUPE (Ke et al., "Rethinking Positional Encoding in Language Pre-training", ICLR 2021) as a provider for the
bias attention family of ``posswap_attention.py``.

Positions leave the input sum; every layer adds the untied positional correlation
``(p_i U_Q) . (p_j U_K) / sqrt(2 d_head)`` per head to its logits, with one table ``p`` and one ``U_Q``, ``U_K``
shared by all layers (one provider, its features computed once per forward). The correlation rides along as
extra query / key features (``[q | pq]``, ``[k | pk]``): exact on sdpa, eager and flex, no (q, k) tensor, and
SDPA keeps its fused kernel (``is_causal``, gradients through q and k only).

Scaling: the content term keeps the model's own ``1/sqrt(d_head)`` (the paper uses ``1/sqrt(2d)`` for both
terms, but it trains from scratch; a retrofit that rescaled the content term would change every layer's logits
at step 0). Only the new term has the paper's ``1/sqrt(2d)``; U_Q and U_K start as the first layer's W_Q and W_K
times 2^(1/4), so at step 0 the term is exactly the original first layer's ``(p_i W_Q) . (p_j W_K) / sqrt(d)``.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from .posswap_architectures import Sites
from .posswap_attention import BiasProvider, install_bias
from .posswap_functional import hide_future
from .posswap_registry import installer
from .posswap_t5 import T5Buckets


class TupeBias(BiasProvider):
    """The untied positional correlation, the [CLS] reset and (TUPE-R) T5 buckets.

    Parameters (created empty: the saved model's class builds them on the meta device; values come from the
    checkpoint, or from ``posswap.patch``): ``positions`` (max_length, table_dim), the table, row i = real
    position i (RoBERTa's offset is taken off the ids); ``query`` / ``key`` (table_dim, hidden), U_Q / U_K whose
    output columns are split per head as the model's own projections are. With ``cls_reset``:
    ``cls_to_others`` / ``others_to_cls`` (heads,), the paper's theta_1 / theta_2: the correlation of a query at
    position 0 with every key, and of every other query with the key at position 0. With ``relative``: a
    ``T5Buckets`` provider (TUPE-R) that gives the dense bias / score_mod term.
    """

    def __init__(
        self,
        num_heads: int,
        table_dim: int,
        hidden: int,
        max_length: int,
        offset: int,
        cls_reset: bool,
        relative: BiasProvider | None = None,
    ):
        super().__init__()
        self.num_heads, self.head_dim, self.position_offset = num_heads, hidden // num_heads, offset
        self.cls_reset, self.relative, self.has_bias, self.has_features = (
            cls_reset,
            relative,
            relative is not None,
            True,
        )
        self.positions = nn.Parameter(torch.empty(max_length, table_dim))
        self.query = nn.Parameter(torch.empty(table_dim, hidden))
        self.key = nn.Parameter(torch.empty(table_dim, hidden))
        if cls_reset:
            self.cls_to_others = nn.Parameter(torch.empty(num_heads))
            self.others_to_cls = nn.Parameter(torch.empty(num_heads))

    @property
    def shift_invariant(self) -> bool:  # TUPE-R: its buckets' bias (the features are not part of the bias)
        return self.relative is not None and self.relative.shift_invariant

    @property
    def far_distance(self) -> int | None:  # TUPE-R: its buckets'
        return None if self.relative is None else self.relative.far_distance

    def projected(self, pos: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """(b|1, heads, n, head_dim) in fp32: rows of the table at ``pos`` through U_Q or U_K."""
        rows = self.positions.float()[pos.clamp(0, self.positions.shape[0] - 1)]  # padded keys: any row, masked
        out = rows @ weight.float()
        return out.view(*pos.shape, self.num_heads, self.head_dim).transpose(1, 2)

    def correlation(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """The term added to the logits, dense (b|1, heads, q, k): the reference for tests, not the hot path."""
        fq, fk = self.features(q_pos, k_pos, 1.0)
        return fq @ fk.transpose(-1, -2)

    def features(self, q_pos: torch.Tensor, k_pos: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Built once per forward and shared by the layers (the attention family keeps them in the call's state)."""
        # The kernel multiplies q.k by the layer's scaling: divide it out, so the term is the paper's 1/sqrt(2d).
        fq = self.projected(q_pos, self.query) / (math.sqrt(2 * self.head_dim) * scaling)
        fk = self.projected(k_pos, self.key)
        if self.cls_reset:
            fq, fk = self._reset(fq, fk, q_pos, k_pos, scaling)
        return fq, fk

    def _reset(self, fq, fk, q_pos, k_pos, scaling):
        """Two more feature dims carry theta: keys [key is [CLS], key is not], queries from [CLS] [theta_1, theta_1],
        other queries [theta_2, 0]; the correlation itself is zeroed on [CLS]'s row and column."""
        q0, k0 = (q_pos == 0)[:, None, :, None], (k_pos == 0)[:, None, :, None]
        theta1 = self.cls_to_others.float()[:, None, None] / scaling  # (heads, 1, 1)
        theta2 = self.others_to_cls.float()[:, None, None] / scaling
        to_cls = torch.where(q0, theta1, theta2)
        to_others = torch.where(q0, theta1, torch.zeros_like(theta1))
        fq = torch.cat([fq.masked_fill(q0, 0), to_cls, to_others], dim=-1)
        fk = torch.cat(
            [fk.masked_fill(k0, 0), k0.float().expand(*fk.shape[:-1], 1), (~k0).float().expand(*fk.shape[:-1], 1)],
            dim=-1,
        )
        return fq, fk

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return self.relative.bias(q_pos, k_pos)

    def score_term(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Callable:
        return self.relative.score_term(q_pos, k_pos)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, length={self.positions.shape[0]}, cls_reset={self.cls_reset}"


@installer("tupe")
def install_tupe(model: nn.Module, sites: Sites, block: dict) -> None:
    config, heads = model.config, model.config.num_attention_heads
    # TUPE-R: T5's buckets as the paper uses them (32 buckets, max distance 128), causal for decoders.
    relative = T5Buckets(heads, 32, 128, bidirectional=not sites.arch.causal) if block.get("relative") else None
    table_dim = sites.table_dim  # NoPositions keeps the dropped table's width
    provider = TupeBias(
        heads, table_dim, config.hidden_size, block["max_length"], sites.offset, block["cls_reset"], relative
    )
    install_bias(model, sites.base, sites.self_attentions(), [provider], block.get("backend") or "sdpa", sites.offset)


def tupe_map(model: nn.Module, sites: Sites, positions: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The positional correlation (p_i U_Q).(p_j U_K) / sqrt(2d) (shared by the layers; with the [CLS] reset
    where the model has one), averaged over heads; TUPE-R's bucket bias is not in it."""
    provider: TupeBias = sites.self_attentions()[0].posswap_bias
    p = positions.to(provider.positions.device)[None]
    correlation = provider.correlation(p, p)[0].mean(0).cpu()
    return hide_future(correlation, positions, sites.arch.causal), "TUPE: (p_i U_Q)·(p_j U_K)/√(2d), mean of heads"
