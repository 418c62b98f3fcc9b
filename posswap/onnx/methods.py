"""Graph forms of the methods that change attention (``alibi``, ``t5-bias``, ``tupe``, ``rope``, ``nope``) and of
``sinusoidal``'s fixed table: what
the exported model runs in place of posswap's attention code, written with plain tensor ops that ``torch.export``
traces.

The torch model's attention functions (``portable/posswap_attention.py``) keep per-call state, look at the KV
cache and read values in Python (T5's span of distances, the blocked CPU paths); a graph has no cache and no
explicit position ids (its inputs are the token ids and the mask), so each call's positions are ``0 .. n - 1``
(counted from RoPE's / RoBERTa's first id as the torch model counts them) and the bias is computed from them in the
graph: ALiBi's ``-m_h * |i - j|`` from the two position vectors, T5's table row per key-minus-query distance looked
up through a vector of buckets (``2 * max_distance + 1`` entries, the torch model's own bucket function run at
export time: a distance past ``max_distance`` is in the last bucket), TUPE's features from its table. Nothing the
size of the sequence is stored. RoPE's cos/sin come from the positions too; its rotation is applied to q and k at
attention time (the same as at projection time without a cache).

:func:`install_graph_form` sets this up on the plain transformers model (``graph.native_model``) before its weights
load: the learned table dropped where the method dropped it, the providers (with their parameters) attached, and
the model switched to :data:`GRAPH_ATTENTION`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from ..methods.backends import installs_attention
from ..portable.posswap_architectures import find_stacks
from ..portable.posswap_attention import bias_positions, merge_mask, with_features
from ..portable.posswap_functional import apply_rotary
from ..portable.posswap_registry import KEEPS_TABLE
from ..portable.posswap_runtime import drop_table
from ..portable.posswap_t5 import T5Buckets, t5_buckets
from ..portable.posswap_tables import SinusoidalPositions
from ..portable.posswap_tupe import TupeBias
from ..registry import get_method

GRAPH_ATTENTION = "posswap_onnx"  # the attention implementation of an exported graph
ROTARY = "posswap_graph_rotary"  # attribute of a self-attention module: a copy of the model's Rotary (rope)
BUCKETS = "posswap_graph_buckets"  # attribute of a T5Buckets copy: the bucket of each distance -d .. d


def graph_refusal(block: dict) -> str | None:
    """Why a patch with a graph form here cannot be written as one (None: it can)."""
    if block.get("method") == "rope" and block.get("rope_type") == "dynamic":
        return (
            "RoPE's dynamic scaling sets its frequencies from each call's longest position, which the graph does not "
            "compute"
        )
    return None


def adds_bias(model: nn.Module) -> bool:
    """Whether ``model``'s graph adds a float bias to the attention mask (its Attention nodes keep that mask)."""
    return any(getattr(a, "posswap_bias", None) is not None for s in find_stacks(model) for a in s.self_attentions())


def install_graph_form(model: nn.Module, native: nn.Module) -> None:
    """Give ``native`` (the plain model of ``model``'s class, weights not yet loaded) the graph form of ``model``'s
    patch; nothing for a stock model or a patch that only changed weights."""
    block = getattr(model.config, "posswap", None)
    if not isinstance(block, dict):
        return
    for sites, target in zip(find_stacks(model), find_stacks(native), strict=True):
        if block["method"] not in KEEPS_TABLE and block.get("absolute", "drop") == "drop":
            drop_table(target)
        _copy_fixed_table(sites, target)
        attentions, copies = sites.self_attentions(), target.self_attentions()
        rotary = copy.deepcopy(getattr(sites.base, "posswap_rotary", None))  # its caches filled here, not in export
        if rotary is not None:
            rotary.frequencies(torch.device("cpu"))
        providers = getattr(sites.base, "posswap_bias_providers", None)
        if providers is not None:
            target.base.posswap_bias_providers = copy.deepcopy(providers)  # loaded with the weights, by name
            for provider in target.base.posswap_bias_providers:
                _prepare(provider)
        for attention, twin in zip(attentions, copies, strict=True):
            if rotary is not None:
                object.__setattr__(twin, ROTARY, rotary)
            if providers is not None:
                index = next(i for i, p in enumerate(providers) if p is attention.posswap_bias)
                object.__setattr__(twin, "posswap_bias", target.base.posswap_bias_providers[index])
                object.__setattr__(twin, "posswap_first_id", getattr(attention, "posswap_first_id", 0))
    if installs_attention(get_method(block["method"]).config_class):  # rope, alibi, t5-bias, tupe: a backend
        native.set_attn_implementation(GRAPH_ATTENTION)


def _copy_fixed_table(sites, target) -> None:
    """A table the method put in the learned one's place (``sinusoidal``'s fixed rows), copied with its rows made."""
    table = getattr(sites.owner, sites.arch.table)
    if isinstance(table, SinusoidalPositions):
        table = copy.deepcopy(table)
        table.table(torch.device("cpu"))
        setattr(target.owner, target.arch.table, table)


def _prepare(provider: nn.Module) -> None:
    """What a provider computes on first use, computed now (a tensor cached during export would be the tracer's):
    ALiBi's slopes, and T5's bucket of each distance -max_distance .. max_distance, by the torch model's function
    (the graph's own log could round a boundary distance into the next bucket)."""
    if hasattr(provider, "slopes"):
        provider.slopes(torch.device("cpu"))
    buckets = provider.relative if isinstance(provider, TupeBias) else provider
    if isinstance(buckets, T5Buckets):
        distances = torch.arange(-buckets.max_distance, buckets.max_distance + 1)
        table = t5_buckets(distances, buckets.bidirectional, buckets.num_buckets, buckets.max_distance)
        object.__setattr__(buckets, BUCKETS, table)


def graph_bias(provider: nn.Module, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """The provider's dense bias (b|1, heads, q, k), fp32, with ops a graph holds."""
    buckets = provider.relative if isinstance(provider, TupeBias) else provider
    if not isinstance(buckets, T5Buckets):
        return provider.bias(q_pos, k_pos)  # ALiBi: arithmetic on the positions
    table = getattr(buckets, BUCKETS).to(q_pos.device)
    reach = buckets.max_distance
    distance = (k_pos[..., None, :] - q_pos[..., :, None]).clamp(-reach, reach) + reach  # memory minus query, as T5
    return buckets.relative_attention_bias(table[distance]).permute(0, 3, 1, 2).float()


def rotated(module: nn.Module, query: torch.Tensor, key: torch.Tensor, kwargs: dict):
    """q and k (b, heads, n, head_dim) rotated at the positions RoPE's hook uses: the ids the model passes down,
    else ``0 .. n - 1``."""
    positions = kwargs.get("position_ids")
    if positions is None:
        positions = torch.arange(query.shape[2], device=query.device)[None]
    cos, sin = getattr(module, ROTARY).cos_sin(positions)
    turn = lambda x: apply_rotary(x.transpose(1, 2), cos, sin).transpose(1, 2)  # noqa: E731
    return turn(query), turn(key)


def graph_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """The attention function of an exported graph: RoPE's rotation, then the bias (added to the mask) and TUPE's
    features, then scaled_dot_product_attention (the exporter's standard ``Attention`` node)."""
    if getattr(module, ROTARY, None) is not None:
        query, key = rotated(module, query, key, kwargs)
    provider = getattr(module, "posswap_bias", None)
    if provider is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    scaling, head_dim = (query.shape[-1] ** -0.5 if scaling is None else scaling), value.shape[-1]
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        attention_mask = attention_mask[..., :k_len]
    mask = attention_mask
    if provider.has_bias:
        first_id = getattr(module, "posswap_first_id", 0)
        positions = bias_positions(
            kwargs.get("position_ids"), q_len, k_len, query.device, provider.position_offset, None, first_id
        )
        mask = merge_mask(module, graph_bias(provider, *positions).to(query.dtype), attention_mask, q_len, k_len)
    elif mask is None and module.is_causal and q_len > 1:
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril()
    query, key = with_features(module, query, key, scaling, {"position_ids": kwargs.get("position_ids")})
    if query.shape[-1] != head_dim:
        value = F.pad(value, (0, query.shape[-1] - head_dim))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out[..., :head_dim].transpose(1, 2).contiguous(), None


AttentionInterface.register(GRAPH_ATTENTION, graph_attention)
AttentionMaskInterface.register(GRAPH_ATTENTION, sdpa_mask)
