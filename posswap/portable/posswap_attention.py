"""Attention functions posswap registers with transformers' ``AttentionInterface``, each with the mask
function of its kernel family (``AttentionMaskInterface``; without one transformers builds no mask).

One family (sdpa, eager, flex) for every method that adds a bias to the attention logits. The bias itself
comes from a small *provider* (:class:`BiasProvider`): ALiBi's slopes (``posswap_alibi.py``), T5's buckets, TUPE's positional
correlation. Every patched self-attention module carries ``posswap_bias``, its provider (shared by the layers
or one per layer); the provider modules themselves hang on the base model as ``posswap_bias_providers``, so
their parameters are saved, loaded and moved like any other. What one forward builds from them (the bias with the
mask, TUPE's features) is kept in that call's own state (``posswap_state.py``), never on a provider: a model
served from several threads gives every call its own output. ``posswap_flex`` is transformers' own flex
attention under a name any model may use (transformers 5 refuses ``flex_attention`` for GPT-2): RoPE's
``backend="flex"``. Both flex kernels run flex attention off the CPU and SDPA on it (``posswap_flex_route.py``).

The functions are called after the KV-cache update, with ``query``/``key``/``value`` of shape
(batch, heads, length, head_dim). It travels with saved models (``posswap/portable``), so it imports
nothing from the posswap package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import BlockMask
from transformers import AttentionInterface
from transformers.cache_utils import Cache
from transformers.integrations.flex_attention import compile_friendly_flex_attention, flex_attention_forward
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask, flex_attention_mask, sdpa_mask

from .posswap_blocked import (
    contiguous_positions,
    distance_vector,
    fast_sdpa,
    general_sdpa,
    key_prefix_lengths,
    wanted,
)
from .posswap_blocked_grad import BlockedBiasAttention, make_plan, trainable
from .posswap_flex_route import flex_or_sdpa_mask, plain_flex_attention, refuse_dropout, runs_flex
from .posswap_functional import hide_future
from .posswap_hooks import CACHE_KWARGS, find_hooks
from .posswap_state import STATE_KWARG, install_call_state, shared

# backend -> registered name. No name contains "flex_attention": transformers refuses that for GPT-2.
BIAS_IMPLEMENTATIONS = {"sdpa": "posswap_bias_sdpa", "flex": "posswap_bias_flex", "eager": "posswap_bias_eager"}
FLEX = "posswap_flex"
PLAIN_IMPLEMENTATIONS = {"sdpa": "sdpa", "flex": FLEX, "eager": "eager"}  # backend -> name, for RoPE
BACKENDS = tuple(PLAIN_IMPLEMENTATIONS)  # the choices of a method's `backend` option; None: as loaded


class BiasProvider(nn.Module):
    """The additive attention bias of one method, from integer positions of queries and keys.

    ``bias(q_pos, k_pos)``: a dense fp32 tensor (batch or 1, heads, q, k) for sdpa / eager.
    ``score_term(q_pos, k_pos)``: a function ``(b, h, q_idx, kv_idx) -> bias`` for flex's score_mod, which
    builds no (q, k) tensor; ``q_pos`` / ``k_pos`` are expanded to the batch there.
    ``features(q_pos, k_pos, scaling)``: optional extra query / key features (b|1, h, q|k, f), appended to q and
    k, whose dot product times ``scaling`` is a low-rank part of the logits (TUPE): exact on every kernel, no
    (q, k) tensor. ``has_bias = False``: features only, the kernel runs with the model's own mask.
    ``has_features = True``: the provider gives them.
    ``position_offset``: subtracted from explicit position ids (RoBERTa's padding_idx + 1), for absolute methods.
    A provider holds no per-call state: the bias+mask and the features of one forward live in that call's state
    (``posswap_state.CallState``), where every layer sharing this provider reuses them (built once, and autograd
    saves one copy).
    """

    has_bias = True
    has_features = False
    position_offset = 0
    shift_invariant = False  # the bias depends on q_pos - k_pos alone (the blocked CPU path's fast route)
    # Causal distances q_pos - k_pos at or past this one all read one parameter (T5's last bucket): a training step
    # then needs the bias gradient of the nearer distances only (posswap_blocked_grad.py). None: no such distance.
    far_distance: int | None = None

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def score_term(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> Callable:
        raise NotImplementedError

    def features(
        self, q_pos: torch.Tensor, k_pos: torch.Tensor, scaling: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None


# Attribute that posswap sets on a KV cache (transformers' Cache object) after each forward of a bias model: the
# positions of all its keys, (batch or 1, keys), so that the next call builds the bias from the keys' own positions.
KEY_POSITIONS = "posswap_key_positions"


def bias_positions(
    position_ids: torch.Tensor | None,
    q_len: int,
    k_len: int,
    device,
    offset: int = 0,
    kwargs: dict | None = None,
    first_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer positions (batch or 1, q) and (batch or 1, k) of the queries and keys, less ``offset``.

    Queries: the explicit ids (packed sequences, PoSE, generate's padding-aware ids), else the next ``q_len`` after
    the cached keys, as ids (counted from ``first_id``: RoBERTa's padding_idx + 1, as its own ids are). Keys: without
    cached keys, the queries' own; with cached keys, the positions that the calls which filled the cache recorded on
    it (``KEY_POSITIONS``), then the queries'. So ids that jump (10 cached tokens, then 5 at positions 100..104) give
    the bias of one full pass with the same ids, and left-padded ``generate`` (ids from the mask) keeps every real
    token's position. A cache whose positions were not recorded (filled by other code, or passed to the model by
    position) counts as holding positions ``0 .. past - 1``: ids that do not continue it are refused.
    """
    state = kwargs.get(STATE_KWARG) if kwargs else None
    past = k_len - q_len
    new = None
    if position_ids is not None and position_ids.shape[-1] == q_len:
        new = position_ids.to(device)
        new = new[None] if new.dim() == 1 else new
    implicit = torch.arange(past + first_id, k_len + first_id, device=device)[None]
    if past == 0:
        keys = new if new is not None else implicit
    else:
        new = implicit if new is None else new
        cached = _cached_positions(state, past, new.shape[0], device)
        if cached is None:
            # CheckCachedPositions refuses this before the cache grows
            if not torch.equal(new, implicit.expand_as(new)):
                raise _unknown_jump(past, new, first_id)
            keys = torch.arange(first_id, k_len + first_id, device=device)[None]
        else:
            rows = max(cached.shape[0], new.shape[0])
            keys = torch.cat([cached.expand(rows, -1), new.expand(rows, -1)], dim=-1)
    if state is not None:
        state.key_positions = keys  # kept on the cache the model returns (KeepKeyPositions)
    keys = keys - offset
    return keys[..., past:], keys


def _cached_positions(state, past: int, batch: int, device) -> torch.Tensor | None:
    """Recorded positions of the first ``past`` keys of the call's cache (a cropped cache keeps a prefix), or None."""
    stored = getattr(getattr(state, "cache", None), KEY_POSITIONS, None)
    if not isinstance(stored, torch.Tensor):
        return None
    if stored.shape[-1] < past or not (stored.shape[0] in (1, batch) or batch == 1):
        return None
    return stored[..., :past].to(device)


def _unknown_jump(past: int, new: torch.Tensor, first_id: int = 0) -> ValueError:
    return ValueError(
        f"position_ids {int(new.min())}..{int(new.max())} for {new.shape[-1]} new tokens do not continue the KV cache "
        f"of {past} tokens, and the positions of its keys are unknown (the cache was not filled by this model's forward, "
        "or was passed to it by position): the position bias (ALiBi, T5 bias, TUPE) needs them. Fill the cache by calling "
        f"this model with past_key_values=..., or pass position_ids {past + first_id}..{past + first_id + new.shape[-1] - 1}."
    )


class CheckCachedPositions:
    """Forward pre-hook on the base model of a bias model: refuses, before any layer adds to the cache, position ids
    that jump away from a cache whose keys' positions are unknown (see :func:`bias_positions`). ``first_id``: the id
    of the first position (RoBERTa's padding_idx + 1)."""

    def __init__(self, first_id: int = 0):
        self.first_id = first_id

    def __call__(self, base: nn.Module, args: tuple, kwargs: dict) -> None:
        state, new = kwargs.get(STATE_KWARG), kwargs.get("position_ids")
        cache = getattr(state, "cache", None)
        if cache is None or not isinstance(new, torch.Tensor) or new.is_floating_point() or new.dim() not in (1, 2):
            return None  # no cache, implicit ids, or ids the length guard refuses
        past = cache.get_seq_length()
        if past == 0 or _cached_positions(state, past, new.shape[0] if new.dim() == 2 else 1, new.device) is not None:
            return None
        start = past + self.first_id
        if not torch.equal(new, torch.arange(start, start + new.shape[-1], device=new.device).expand_as(new)):
            raise _unknown_jump(past, new, self.first_id)
        return None


class KeepKeyPositions:
    """Forward hook on the base model of a bias model: the key positions its call used, kept on the cache it
    returns (one the caller passed, or one the model made), for the next call. An object, not a closure."""

    def __call__(self, base: nn.Module, args: tuple, kwargs: dict, output) -> None:
        state = kwargs.get(STATE_KWARG)
        if state is None or state.key_positions is None:
            return None
        # A ModelOutput is read as the plain dict of its set fields: its old-name accessors (``.past_key_values``,
        # ``.get("past_key_values")``) log transformers 5.24's deprecation warning on a call that never named it.
        if isinstance(output, dict):
            found = (dict.get(output, n) for n in CACHE_KWARGS)
        else:
            found = (getattr(output, n, None) for n in CACHE_KWARGS)
        cache = next((c for c in found if c is not None), None)
        if cache is None and isinstance(output, tuple):  # return_dict=False
            cache = next((item for item in output if isinstance(item, Cache)), None)
        if cache is not None:
            with contextlib.suppress(AttributeError):  # a cache class with __slots__: its positions stay unknown
                setattr(cache, KEY_POSITIONS, state.key_positions.detach())
        return None


def _writable(bias: torch.Tensor, mask_shape: torch.Size) -> torch.Tensor:
    """A tensor of the broadcast shape that the mask may be folded into in place: ``bias`` itself when it is a
    fresh tensor of that shape (at 4k tokens one (heads, n, n) tensor is hundreds of MiB, so no second one),
    else a copy. A provider's bias that needs grad may be a view of its parameters: always a copy then."""
    shape = torch.broadcast_shapes(bias.shape, mask_shape)
    return bias if bias.shape == shape and not bias.requires_grad else bias.expand(shape).clone()


def additive_mask(module, query, key, attention_mask, kwargs: dict) -> torch.Tensor:
    """Bias plus mask as one float mask (batch or 1, heads, q, k) in the query's dtype; built once per forward (the
    layers sharing a provider pass the same inputs: the same mask and position ids tensors), in the call's state."""
    provider: BiasProvider = module.posswap_bias
    position_ids = kwargs.get("position_ids")
    key_ = (attention_mask, position_ids, query.shape[2], key.shape[2], query.dtype)
    return shared(
        kwargs, (provider, "mask"), key_, lambda: _build_mask(module, query, key, attention_mask, position_ids, kwargs)
    )


def _build_mask(module, query, key, attention_mask, position_ids, kwargs) -> torch.Tensor:
    q_len, k_len = query.shape[2], key.shape[2]
    positions = call_positions(module, q_len, k_len, query.device, kwargs)
    return merge_mask(module, module.posswap_bias.bias(*positions).to(query.dtype), attention_mask, q_len, k_len)


def call_positions(module, q_len: int, k_len: int, device, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`bias_positions` of this call's queries and keys, made once per forward (the mask, the features and the
    blocked path all read them), in the call's state."""
    provider: BiasProvider = module.posswap_bias
    position_ids = kwargs.get("position_ids")

    def locate():
        return bias_positions(position_ids, q_len, k_len, device, provider.position_offset, kwargs, _first_id(module))

    return shared(kwargs, (provider, "positions"), (position_ids, q_len, k_len), locate)


def merge_mask(module, bias, attention_mask, q_len: int, k_len: int, first_row: int = 0) -> torch.Tensor:
    """The bias (b|1, heads, rows, keys) of queries ``first_row ..`` (of ``q_len``) against the first ``keys`` of
    ``k_len`` keys, with the mask (already cut to those rows) folded in as one float mask."""
    rows, keys = bias.shape[-2:]
    lowest = torch.finfo(bias.dtype).min
    if attention_mask is None and module.is_causal and q_len > 1:
        # SDPA would have used is_causal; a bias rules that out, so the causal mask is built here
        # (bottom-right aligned: correct with cached keys too).
        attention_mask = torch.ones(rows, keys, dtype=torch.bool, device=bias.device).tril(k_len - q_len + first_row)
    if attention_mask is None:
        combined = bias
    elif attention_mask.dtype == torch.bool:
        combined = _writable(bias, attention_mask.shape).masked_fill_(~attention_mask, lowest)
    else:  # additive float mask: clamp so that lowest + bias cannot overflow to -inf
        mask = attention_mask[..., :keys].to(bias.dtype)
        combined = _writable(bias, mask.shape).add_(mask).clamp_min_(lowest)
    return combined


def with_features(module, query, key, scaling: float, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k with the provider's extra features appended (unchanged when it has none). ``scaling`` is the
    layer's own, taken before the head dim grows. The features are built once per forward, in the call's state."""
    provider: BiasProvider = module.posswap_bias
    if not provider.has_features:
        return query, key
    q_len, k_len = query.shape[2], key.shape[2]
    position_ids = kwargs.get("position_ids")

    def build():
        positions = call_positions(module, q_len, k_len, query.device, kwargs)
        return tuple(f.to(query.dtype) for f in provider.features(*positions, scaling))

    key_ = (position_ids, q_len, k_len, scaling, query.dtype)
    fq, fk = (f.expand(query.shape[0], -1, -1, -1) for f in shared(kwargs, (provider, "features"), key_, build))
    return torch.cat([query, fq], dim=-1), torch.cat([key, fk], dim=-1)


def bias_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    if not hasattr(module, "posswap_bias"):  # cross-attention: not patched, plain SDPA
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scaling, head_dim = (query.shape[-1] ** -0.5 if scaling is None else scaling), value.shape[-1]
    blocked = module.posswap_bias.has_bias and wanted(module, query, key, value, attention_mask, dropout)
    trained = not blocked and trainable(module, query, key, attention_mask, dropout)
    mask = None
    if module.posswap_bias.has_bias and not blocked and not trained:
        mask = additive_mask(module, query, key, attention_mask, kwargs)
    query, key = with_features(module, query, key, scaling, kwargs)
    if query.shape[-1] != head_dim:
        # CPU's fused SDPA kernels want v as wide as q and k (else the math path, 3x slower): zeros, cut off after.
        value = F.pad(value, (0, query.shape[-1] - head_dim))
    if not blocked and not trained and mask is None:
        # features only: the model's own mask (or is_causal), as plain SDPA runs it
        out, _ = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return out[..., :head_dim].contiguous(), None
    if blocked:  # inference on CPU: the bias never built whole (posswap_blocked.py)
        out = blocked_attention(module, query, key, value, attention_mask, scaling, kwargs)
    elif trained:  # training on CPU: the bias per block, recomputed in backward (posswap_blocked_grad.py)
        out = blocked_training(module, query, key, value, attention_mask, scaling, dropout, kwargs)
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
    return out[..., :head_dim].transpose(1, 2).contiguous(), None


def blocked_attention(module, query, key, value, attention_mask, scaling: float, kwargs: dict) -> torch.Tensor:
    """SDPA with the bias made block by block (``posswap_blocked.py``), (batch, heads, q, head_dim). The
    positions and the plan (shift-invariant bias vector, right-padding lengths) are made once per forward."""
    provider: BiasProvider = module.posswap_bias
    q_len, k_len = query.shape[2], key.shape[2]
    position_ids = kwargs.get("position_ids")
    causal = module.is_causal and q_len > 1
    positions = call_positions(module, q_len, k_len, query.device, kwargs)

    def plan():
        if not provider.shift_invariant or not contiguous_positions(positions[1]):
            return None
        if attention_mask is None:
            lengths = None
        elif causal or (lengths := key_prefix_lengths(attention_mask, query.shape[0], k_len)) is None:
            return None
        return distance_vector(provider, q_len, k_len, causal, query.dtype), lengths

    fast = shared(kwargs, (provider, "plan"), (attention_mask, position_ids, q_len, k_len, query.dtype), plan)
    if fast is not None:
        return fast_sdpa(query, key, value, fast[0], causal, fast[1], scaling)

    def combine(q_pos, k_pos, mask, first_row):
        return merge_mask(module, provider.bias(q_pos, k_pos).to(query.dtype), mask, q_len, k_len, first_row)

    return general_sdpa(query, key, value, attention_mask, positions, combine, causal, scaling)


def blocked_training(module, query, key, value, attention_mask, scaling: float, dropout: float, kwargs: dict):
    """Attention with gradients, the bias gathered per block from a distance table (``posswap_blocked_grad.py``),
    (batch, heads, q, head_dim). The table (with its graph to the provider's parameters) is made once per forward;
    the dropout's seed is drawn per layer from torch's RNG (a checkpointed layer run again draws it again)."""
    provider: BiasProvider = module.posswap_bias
    q_len, k_len = query.shape[2], key.shape[2]
    causal = module.is_causal and q_len > 1
    positions = call_positions(module, q_len, k_len, query.device, kwargs)
    key_ = (attention_mask, kwargs.get("position_ids"), q_len, k_len, query.dtype, scaling, dropout)
    table, plan = shared(
        kwargs,
        (provider, "training plan"),
        key_,
        lambda: make_plan(provider, positions, attention_mask, causal, scaling, query.dtype, dropout),
    )
    seed = int(torch.randint(2**62, (1,))) if dropout > 0 else 0
    return BlockedBiasAttention.apply(query, key, value, table, plan, seed)


def bias_eager_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Reference implementation (tests, attention weights); not the hot path."""
    if not hasattr(module, "posswap_bias"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    if module.posswap_bias.has_bias:
        mask = additive_mask(module, query, key, attention_mask, kwargs)
    else:  # eager_mask always gives a float mask; none only where nothing is masked
        mask = 0.0 if attention_mask is None else attention_mask[..., : key.shape[2]]
    query, key = with_features(module, query, key, scaling, kwargs)
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling + mask
    weights = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def bias_flex_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """flex_attention with the bias computed inside the kernel by ``score_mod``: no (batch, heads, q, k) tensor.
    On CPU the SDPA path with the same bias (``posswap_flex_route.py``: the CPU kernel is not exact everywhere)."""
    refuse_dropout(dropout)
    if not runs_flex(query.device):
        return bias_sdpa_attention(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    if not hasattr(module, "posswap_bias"):
        return flex_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    batch, _, q_len, _ = query.shape
    k_len = key.shape[2]
    if attention_mask is not None and not isinstance(attention_mask, BlockMask):
        raise ValueError(
            "Backend 'flex' needs the BlockMask transformers builds; got a tensor mask. Use backend='sdpa'."
        )
    if attention_mask is None and module.is_causal and q_len > 1:
        attention_mask = flex_attention_mask(batch, q_len, k_len, q_offset=k_len - q_len, device=query.device)
    provider: BiasProvider = module.posswap_bias
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    score_mod = None
    if provider.has_bias:
        q_pos, k_pos = bias_positions(
            kwargs.get("position_ids"), q_len, k_len, query.device, provider.position_offset, kwargs, _first_id(module)
        )
        term = provider.score_term(q_pos.expand(batch, -1), k_pos.expand(batch, -1))

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + term(b, h, q_idx, kv_idx)

    query, key = with_features(module, query, key, scaling, kwargs)
    out = compile_friendly_flex_attention(
        query, key, value, score_mod=score_mod, block_mask=attention_mask, scale=scaling, training=module.training
    )
    return out.transpose(1, 2).contiguous(), None


def _first_id(module) -> int:
    return getattr(module, "posswap_first_id", 0)


def install_bias(
    model: nn.Module, base: nn.Module, attentions: list, providers: list[BiasProvider], backend: str, first_id: int = 0
) -> None:
    """Give each self-attention module its provider (one shared by all, or one per layer) and switch the model to
    the bias kernel. The providers are registered once, on the base model; each attention module refers to its
    own without registering it again (no duplicate parameters in the state dict). Their parameters take the
    device and dtype of the attention weights (the meta device while a saved model is being built)."""
    reference = next(attentions[0].parameters())
    base.posswap_bias_providers = nn.ModuleList(providers).to(device=reference.device, dtype=reference.dtype)
    for i, attention in enumerate(attentions):
        object.__setattr__(attention, "posswap_bias", providers[i % len(providers)])
        object.__setattr__(attention, "posswap_first_id", first_id)  # the id of position 0 (RoBERTa: padding_idx + 1)
    install_call_state(base)  # each forward's bias and features live in that call's state
    if not find_hooks(base, KeepKeyPositions):
        base.register_forward_pre_hook(
            CheckCachedPositions(first_id), with_kwargs=True
        )  # after StartCall: reads its state
        base.register_forward_hook(KeepKeyPositions(), with_kwargs=True)
    model.set_attn_implementation(BIAS_IMPLEMENTATIONS[backend])


def register() -> None:
    """Idempotent: transformers' interfaces are plain global mappings."""
    AttentionInterface.register(FLEX, plain_flex_attention)
    AttentionMaskInterface.register(FLEX, flex_or_sdpa_mask)  # without it no mask is built
    for backend, function, mask in (
        ("sdpa", bias_sdpa_attention, sdpa_mask),
        ("eager", bias_eager_attention, eager_mask),
        ("flex", bias_flex_attention, flex_or_sdpa_mask),
    ):
        AttentionInterface.register(BIAS_IMPLEMENTATIONS[backend], function)
        AttentionMaskInterface.register(BIAS_IMPLEMENTATIONS[backend], mask)


register()


def bias_map(model: nn.Module, sites, positions: torch.Tensor) -> tuple[torch.Tensor, str]:
    """The first layer's bias over ``positions`` (queries x keys), averaged over heads; NaN where a causal mask
    hides the key: the position map of a bias method's pictures."""
    provider = sites.self_attentions()[0].posswap_bias
    p = positions.to(next(model.parameters()).device)[None]
    bias = provider.bias(p, p)[0].float().mean(0).cpu()
    method = model.config.posswap["method"]
    return hide_future(bias, positions, sites.arch.causal), f"{method}: first layer's bias, mean of heads"
