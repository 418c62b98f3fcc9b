"""What the learned table did in the first layer, read at patch time by the ``init="fit"`` of the methods that
drop it (``t5-bias``, ``rope``): the original rows, and the first layer's position-position logits they gave.

The rows are carried to the first layer as the model carries them (the linear part of the LayerNorm they pass:
centred, divided by the typical standard deviation of that LayerNorm's whole input (token + position), times its
weight; then ELECTRA's projection). The LayerNorm's shift and the q/k biases are left out: with them the extra
terms are constant along a query's row (softmax ignores them) or depend on the key's absolute position alone.
"""

from __future__ import annotations

import torch
from torch import nn

from ..portable.posswap_architectures import Sites
from .architectures import embedding_projection, first_layer_qk


def original_rows(model: nn.Module, sites: Sites) -> torch.Tensor:
    """A copy of the table rows of the original positions (a model patched before: its own original length)."""
    previous = getattr(model.config, "posswap", None) or {}
    length = previous.get("original_length", sites.max_length)
    return sites.table.weight.detach()[sites.table_offset : sites.table_offset + length].clone()


def position_inputs(model: nn.Module, sites: Sites, rows: torch.Tensor) -> torch.Tensor:
    """The table rows as the first layer's q/k projections see them (linear part only; see the module docstring)."""
    norm = sites.base.get_submodule(sites.arch.first_norm)
    content = model.get_input_embeddings().weight.detach().double()
    token_type = getattr(sites.owner, "token_type_embeddings", None)
    if token_type is not None:  # BERT family: every token also carries token type 0
        content = content + token_type.weight.detach()[0].double()
    p = rows.double()

    def centred(x):
        return x - x.mean(-1, keepdim=True)

    # Mean over (token, position) of the variance of token + position, expanded so that no (V, L, D) tensor is built.
    cross = (centred(content.mean(0)) * centred(p.mean(0))).mean()
    variance = centred(content).pow(2).mean() + centred(p).pow(2).mean() + 2 * cross
    x = centred(p) / torch.sqrt(variance + norm.eps) * norm.weight.detach().double()
    projection = embedding_projection(sites)
    return x @ projection.weight.detach().double().T if projection is not None else x


def first_layer_position_scores(model: nn.Module, sites: Sites, rows: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(heads, L, L) float64 position-position logits of the first layer (scaling included), and that scaling."""
    attention, heads = sites.self_attentions()[0], model.config.num_attention_heads
    w_q, w_k = (w.double() for w in first_layer_qk(sites))
    x = position_inputs(model, sites, rows)
    length = x.shape[0]
    q, k = ((x @ w).view(length, heads, -1).transpose(0, 1) for w in (w_q, w_k))  # (heads, L, head_dim)
    scaling = getattr(attention, "scaling", q.shape[-1] ** -0.5)
    return q @ k.transpose(-1, -2) * scaling, scaling
