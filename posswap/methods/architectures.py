"""Patch-time readings of a model's architecture (first-layer q/k weights, ELECTRA's projection) that run time
never needs. The per-architecture facts themselves live in ``portable/posswap_architectures.py``, because saved
models carry them; posswap imports them from there (one rule: portable names come from ``posswap.portable``)."""

import torch
from torch import nn

from ..portable.posswap_architectures import Sites


def first_layer_qk(sites: Sites) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q and W_K of the first self-attention as (in, hidden) matrices, detached (GPT-2's fused c_attn is a
    Conv1D stored (in, out); BERT's query / key are Linear (out, in))."""
    attention, hidden = sites.self_attentions()[0], sites.config.hidden_size
    matrices = []
    for name, chunks in sites.arch.qk_projections:
        weight = getattr(attention, name).weight.detach()
        weight = weight if sites.arch.conv1d else weight.t()
        matrices += [weight[:, c * hidden : (c + 1) * hidden] for c in chunks]
    w_q, w_k = matrices
    return w_q, w_k


def first_layer_qk_biases(sites: Sites) -> tuple[torch.Tensor, torch.Tensor]:
    """b_Q and b_K of the first self-attention, (hidden,) views of the parameters (write under no_grad)."""
    attention, hidden = sites.self_attentions()[0], sites.config.hidden_size
    biases = []
    for name, chunks in sites.arch.qk_projections:
        bias = getattr(attention, name).bias
        biases += [bias.data[c * hidden : (c + 1) * hidden] for c in chunks]
    b_q, b_k = biases
    return b_q, b_k


def embedding_projection(sites: Sites) -> nn.Linear | None:
    """The map from the embeddings to the first layer's width, where the model has one (ELECTRA whose
    embedding size differs from its hidden size)."""
    return getattr(sites.base, sites.arch.embedding_projection, None) if sites.arch.embedding_projection else None
