"""``RopeConfig(init="fit")``: RoPE that starts with what the dropped table did in the first layer.

The learned table gave each first-layer head a position-position logit, mostly a function of the distance
``d = i - j`` (the previous-token heads a copier relies on: a peak at d = 1). RoPE on its own gives no such term,
but a rotated q/k *bias* does: with a pair of rotary dims at frequency w, biases ``b_q = r (cos phi, sin phi)`` and
``b_k = (r, 0)`` add ``r^2 cos(d w + phi)`` to the logit of every (i, j), whatever the tokens (Barbero et al. 2024:
positional heads are built from RoPE's highest frequencies). So the fit:

1. the first layer's position-position logits of the original table, as ``t5_bias.init="fit"`` computes them
   (the table rows carried through the linear part of the first LayerNorm);
2. per head, their mean along each diagonal, each query's row centred first (softmax ignores a row's constant);
3. a weighted ridge least squares of that profile on ``cos(d w), sin(d w)`` for the rotary frequencies that turn
   at least once inside the old window (slower ones would fit a trend the fit cannot see end);
4. each frequency's amplitude and phase written into the first layer's q/k biases on its pair of rotary dims
   (the other rotary dims' biases set to 0: rotated, they would add a positional term the table never had).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..portable.posswap_architectures import Sites
from .architectures import first_layer_qk_biases
from .table_logits import first_layer_position_scores

RIDGE = 1e-3  # of the mean diagonal of the normal equations: keeps near-collinear frequencies' amplitudes small


def distance_profile(scores: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(heads, L, L) logits -> (heads, D) mean per distance, (D,) pairs per distance, (D,) distances ``i - j``:
    0 .. L-1 for a decoder (keys up to the query), -(L-1) .. L-1 for an encoder. Rows centred over their keys."""
    length = scores.shape[-1]
    positions = torch.arange(length)
    distance = positions[:, None] - positions[None, :]
    keep = distance >= 0 if causal else torch.ones(length, length, dtype=torch.bool)
    keys = keep.sum(1, keepdim=True).to(scores.dtype)
    row_means = (scores * keep).sum(-1, keepdim=True) / keys
    centred = (scores - row_means)[:, keep]
    index = (distance[keep] + (0 if causal else length - 1)).long()
    size = length if causal else 2 * length - 1
    counts = torch.bincount(index, minlength=size).to(scores.dtype)
    sums = scores.new_zeros(scores.shape[0], size).index_add_(1, index, centred)
    distances = torch.arange(size) - (0 if causal else length - 1)
    return sums / counts.clamp_min(1), counts, distances


def fit_cosines(
    profile: torch.Tensor, weights: torch.Tensor, distances: torch.Tensor, frequencies: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(heads, D) profile ~ sum_m c_m cos(d w_m) + s_m sin(d w_m): returns c, s (heads, M), weighted by ``weights``."""
    angles = distances.to(profile.dtype)[:, None] * frequencies.to(profile.dtype)[None]
    basis = torch.cat([angles.cos(), angles.sin()], dim=1)  # (D, 2M)
    normal = basis.T @ (weights[:, None] * basis)
    ridge = RIDGE * normal.diagonal().mean() * torch.eye(normal.shape[0], dtype=normal.dtype)
    right = basis.T @ (weights[None, :, None] * profile[..., None]).squeeze(-1).T  # (2M, heads)
    coefficients = torch.linalg.solve(normal + ridge, right).T  # (heads, 2M)
    return coefficients.chunk(2, dim=1)


def bias_pairs(c: torch.Tensor, s: torch.Tensor, logit_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k biases (heads, M, 2), one (first, second) pair of rotary dims per frequency, whose rotated product
    times ``logit_scale`` (the attention's scaling times the square of RoPE's cos/sin scale) is
    ``c cos(d w) + s sin(d w)``: amplitude ``r^2 = hypot(c, s) / logit_scale``, phase ``atan2(-s, c)``."""
    amplitude = torch.hypot(c, s) / logit_scale
    phase = torch.atan2(-s, c)
    radius = amplitude.sqrt()
    b_q = torch.stack([radius * phase.cos(), radius * phase.sin()], dim=-1)
    b_k = torch.stack([radius, torch.zeros_like(radius)], dim=-1)
    return b_q, b_k


def fit_rotary_biases(model: nn.Module, sites: Sites, rows: torch.Tensor) -> dict:
    """Write the fitted biases into the first layer's q/k projections; returns what the fit explains (R^2 of the
    profile, weighted, per head) for the log."""
    rotary = sites.base.posswap_rotary
    scores, scaling = first_layer_position_scores(model, sites, rows)  # (heads, L, L) float64
    profile, counts, distances = distance_profile(scores, sites.arch.causal)
    inv_freq, cos_scale = rotary.frequencies(torch.device("cpu"))
    inv_freq = inv_freq.double()
    turning = inv_freq >= 2 * math.pi / rows.shape[0]  # at least one full turn inside the old window
    c, s = fit_cosines(profile, counts, distances, inv_freq[turning])
    b_q, b_k = bias_pairs(c, s, scaling * cos_scale**2)
    heads, head_dim, half = scores.shape[0], rotary.head_dim, rotary.rotary_dim // 2
    used = torch.nonzero(turning).squeeze(1)
    with torch.no_grad():
        for bias, pairs in zip(first_layer_qk_biases(sites), (b_q, b_k)):
            per_head = bias.view(heads, head_dim)
            per_head[:, : rotary.rotary_dim] = 0.0
            per_head[:, used] = pairs[..., 0].to(bias.dtype)
            per_head[:, used + half] = pairs[..., 1].to(bias.dtype)
    return {
        "frequencies": int(turning.sum()),
        "explained": explained(profile, counts, distances, inv_freq[turning], c, s),
    }


def explained(profile, weights, distances, frequencies, c, s) -> list[float]:
    """Per head, the weighted R^2 of the fitted cosines on the distance profile."""
    angles = distances.double()[:, None] * frequencies[None]
    fitted = c @ angles.cos().T + s @ angles.sin().T
    mean = (profile * weights).sum(-1, keepdim=True) / weights.sum()
    total = ((profile - mean) ** 2 * weights).sum(-1)
    residual = ((profile - fitted) ** 2 * weights).sum(-1)
    return (1 - residual / total.clamp_min(1e-12)).tolist()
