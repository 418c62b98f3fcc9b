"""Attention functions posswap registers with transformers' ``AttentionInterface``, each with the mask
function of its kernel family (``AttentionMaskInterface``; without one transformers builds no mask).

A method switches a model to one of them with ``model.set_attn_implementation(name)``; the model class and
its attention modules stay transformers' own. The functions are called after the KV-cache update, with
``query``/``key``/``value`` of shape (batch, heads, length, head_dim).

ALiBi: every patched self-attention module carries ``posswap_alibi``, an :class:`AlibiState` shared by the
layers of one model. ``posswap_flex`` is transformers' own flex attention under a name any model may use
(transformers 5 refuses ``flex_attention`` for GPT-2): RoPE's ``backend="flex"``.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.integrations.flex_attention import compile_friendly_flex_attention, flex_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, flex_attention_mask, sdpa_mask

from .posswap_functional import alibi_bias, alibi_slopes
from .posswap_hooks import remove_hooks

# backend -> registered name. No name contains "flex_attention": transformers refuses that for GPT-2.
ALIBI_IMPLEMENTATIONS = {"sdpa": "posswap_alibi_sdpa", "flex": "posswap_alibi_flex", "eager": "posswap_alibi_eager"}
FLEX = "posswap_flex"
PLAIN_IMPLEMENTATIONS = {"sdpa": "sdpa", "flex": FLEX, "eager": "eager"}  # backend -> name, for RoPE


@dataclass
class AlibiState:
    """Shared by the self-attention layers of one model. ``cache`` holds the combined bias+mask of the current
    forward (every layer needs the same one: built once, and autograd saves one copy instead of one per
    layer); a hook on the base model empties it when the forward ends."""

    symmetric: bool
    num_heads: int
    cache: list[Any] = field(default_factory=list)  # [(mask, position_ids, q_len, k_len, dtype), bias_mask]
    # fp32 slopes per device, made on first use: never a buffer, so neither the meta device of transformers'
    # loading nor model.to(torch.bfloat16) touches them.
    _slopes: dict = field(default_factory=dict)

    def clear(self, *args: Any) -> None:
        self.cache.clear()

    def slopes(self, device) -> torch.Tensor:
        device = torch.device(device)
        if device not in self._slopes:
            self._slopes[device] = alibi_slopes(self.num_heads).to(device)
        return self._slopes[device]


def _distances_from_positions(position_ids: torch.Tensor | None, q_len: int, k_len: int) -> bool:
    # Explicit positions (packed sequences, PoSE, generate's padding-aware ids) are used when they describe
    # both queries and keys, i.e. without earlier cached keys. With a cache, query i is key k_len - q_len + i;
    # index distances are also right under left padding because padded keys are masked.
    return position_ids is not None and q_len == k_len and position_ids.shape[-1] == q_len


def _bias(module: torch.nn.Module, q_len: int, k_len: int, position_ids: torch.Tensor | None, device) -> torch.Tensor:
    slopes = module.posswap_alibi.slopes(device)
    if _distances_from_positions(position_ids, q_len, k_len):
        positions = position_ids.to(device)
        return alibi_bias(slopes, positions, positions, module.posswap_alibi.symmetric)  # (b, h, q, k)
    k_pos = torch.arange(k_len, device=device)
    return alibi_bias(slopes, k_pos[k_len - q_len :], k_pos, module.posswap_alibi.symmetric)[None]  # (1, h, q, k)


def _same(a: Any, b: Any) -> bool:
    # Tensors by identity: the cache holds them, so an id cannot be reused while the entry lives.
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or a is None or b is None:
        return a is b
    return a == b


def _writable(bias: torch.Tensor, mask_shape: torch.Size) -> torch.Tensor:
    """``bias`` itself when the mask broadcasts into it, else a copy of the broadcast shape."""
    shape = torch.broadcast_shapes(bias.shape, mask_shape)
    return bias if bias.shape == shape else bias.expand(shape).clone()


def alibi_additive_mask(module, query, key, attention_mask, position_ids) -> torch.Tensor:
    """Bias plus mask as one float mask (batch or 1, heads, q, k) in the query's dtype; built once per forward."""
    state: AlibiState = module.posswap_alibi
    q_len, k_len = query.shape[2], key.shape[2]
    cache_key = (attention_mask, position_ids, q_len, k_len, query.dtype)
    if state.cache and all(map(_same, state.cache[0], cache_key)):
        return state.cache[1]
    bias = _bias(module, q_len, k_len, position_ids, query.device).to(query.dtype)
    lowest = torch.finfo(query.dtype).min
    if attention_mask is None and module.is_causal and q_len > 1:
        # SDPA would have used is_causal; a bias rules that out, so the causal mask is built here
        # (bottom-right aligned: correct with cached keys too).
        attention_mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    if attention_mask is None:
        combined = bias
    # In place on the fresh bias: at 4k tokens one (heads, n, n) tensor is hundreds of MiB, so no second one.
    elif attention_mask.dtype == torch.bool:
        combined = _writable(bias, attention_mask.shape).masked_fill_(~attention_mask, lowest)
    else:  # additive float mask: clamp so that lowest + bias cannot overflow to -inf
        mask = attention_mask[..., :k_len].to(query.dtype)
        combined = _writable(bias, mask.shape).add_(mask).clamp_min_(lowest)
    state.cache[:] = [cache_key, combined]
    return combined


def alibi_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    if not hasattr(module, "posswap_alibi"):  # cross-attention: not patched, plain SDPA
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    mask = alibi_additive_mask(module, query, key, attention_mask, kwargs.get("position_ids"))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def alibi_eager_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Reference implementation (tests, attention weights); not the hot path."""
    if not hasattr(module, "posswap_alibi"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    mask = alibi_additive_mask(module, query, key, attention_mask, kwargs.get("position_ids"))
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def alibi_flex_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """flex_attention with the bias computed inside the kernel by ``score_mod``: no (batch, heads, q, k) tensor."""
    if not hasattr(module, "posswap_alibi"):
        return flex_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    if dropout > 0:
        raise ValueError(
            "ALiBi backend 'flex' has no attention dropout. Set the model's attention dropout to 0 "
            "(attn_pdrop / attention_probs_dropout_prob), call model.eval(), or patch with backend='sdpa'."
        )
    batch, _, q_len, _ = query.shape
    k_len = key.shape[2]
    if attention_mask is not None and not isinstance(attention_mask, BlockMask):
        raise ValueError("ALiBi backend 'flex' needs the BlockMask transformers builds; got a tensor mask. Use backend='sdpa'.")
    if attention_mask is None and module.is_causal and q_len > 1:
        attention_mask = flex_attention_mask(batch, q_len, k_len, q_offset=k_len - q_len, device=query.device)
    slopes, symmetric = module.posswap_alibi.slopes(query.device), module.posswap_alibi.symmetric
    position_ids = kwargs.get("position_ids")
    if _distances_from_positions(position_ids, q_len, k_len):
        positions = position_ids.to(query.device).expand(batch, -1)

        def distance(b, q_idx, kv_idx):
            return positions[b, q_idx] - positions[b, kv_idx]
    else:
        # A tensor, not an int, so a new offset does not make torch.compile recompile.
        offset = torch.tensor(k_len - q_len, device=query.device)

        def distance(b, q_idx, kv_idx):
            return q_idx + offset - kv_idx

    def score_mod(score, b, h, q_idx, kv_idx):
        d = distance(b, q_idx, kv_idx)
        return score - slopes[h] * (d.abs() if symmetric else d)

    out = compile_friendly_flex_attention(
        query, key, value, score_mod=score_mod, block_mask=attention_mask, scale=scaling, training=module.training
    )
    return out.transpose(1, 2).contiguous(), None


class ClearBiasCache:
    """Forward hook on the base model (an object, not a bound handle, so deepcopy gives the copy its own)."""

    def __init__(self, state: AlibiState):
        self.state = state

    def __call__(self, *args: Any) -> None:
        self.state.clear()


def install_alibi(model: torch.nn.Module, base: torch.nn.Module, attentions: list, symmetric: bool, backend: str) -> None:
    """Give every self-attention module of ``model`` the ALiBi state and switch it to the ALiBi kernel."""
    state = AlibiState(symmetric=symmetric, num_heads=model.config.num_attention_heads)
    for attention in attentions:
        attention.posswap_alibi = state
    remove_hooks(base, ClearBiasCache)
    # The per-forward bias cache is emptied when the base model's forward ends (also on errors).
    base.register_forward_hook(ClearBiasCache(state), always_call=True)
    model.set_attn_implementation(ALIBI_IMPLEMENTATIONS[backend])


def register() -> None:
    """Idempotent: transformers' interfaces are plain global mappings."""
    AttentionInterface.register(FLEX, flex_attention_forward)
    AttentionMaskInterface.register(FLEX, flex_attention_mask)  # without it no mask is built
    for backend, function, mask in (
        ("sdpa", alibi_sdpa_attention, sdpa_mask),
        ("eager", alibi_eager_attention, eager_mask),
        ("flex", alibi_flex_attention, flex_attention_mask),
    ):
        AttentionInterface.register(ALIBI_IMPLEMENTATIONS[backend], function)
        AttentionMaskInterface.register(ALIBI_IMPLEMENTATIONS[backend], mask)


register()
