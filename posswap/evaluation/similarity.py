"""Cosine similarity between the position representations of every pair of positions: a model's learned
(or interpolated) table, the sinusoidal table, and rotary embedding (where similarity depends on i - j only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..portable.posswap_architectures import find_sites


def learned_table(model: nn.Module) -> torch.Tensor | None:
    """The rows of the model's position table that real positions use, or None once a method dropped it."""
    sites = find_sites(model)
    if sites.table is None:
        return None
    return sites.table.weight.detach()[sites.table_offset : sites.table_offset + sites.max_length].cpu()


def adjacent_similarity(table: torch.Tensor, length: int) -> float | None:
    """Mean cosine similarity of neighbouring rows among the first ``length`` positions: how smooth the table
    is there (resampled tables are smoother than trained ones). None if the table is shorter than ``length``."""
    if len(table) < length or length < 2:
        return None
    unit = F.normalize(table[:length].float(), dim=-1)
    return (unit[1:] * unit[:-1]).sum(-1).mean().item()


def rotary_similarity(positions: int, head_dim: int, base: float = 10_000.0) -> torch.Tensor:
    """Expected cosine similarity of one random query rotated to positions i and j: mean_k cos((i - j) theta_k),
    theta_k = base^(-2k/head_dim), the analytic form (each pair of features turns by its own angle)."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    distance = torch.arange(positions, dtype=torch.float64)
    distance = distance[:, None] - distance[None, :]
    return torch.cos(distance[..., None] * theta).mean(-1)


def head_dim(model: nn.Module) -> int:
    config = model.config
    return config.hidden_size // config.num_attention_heads
