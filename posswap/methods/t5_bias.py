"""``t5-bias``: T5's learned relative position bias (Raffel et al.) in every self-attention layer: a per-head
bias over log-spaced buckets of the key-minus-query distance, added to the attention logits by posswap's bias
attention family. The provider (``portable/posswap_t5.py``) travels with saved models; this file holds the
config, the checks and the starting values (``init``).

``init="fit"`` starts the buckets where the original's first layer put its position-position logits:
for each head, ``score[i, j] = (x_i W_Q) . (x_j W_K) * scaling`` over the original positions, with ``x_i`` the
table row ``p_i`` carried to the first layer as the model carries it (the linear part of the LayerNorm it passes:
centred, divided by the typical standard deviation of that LayerNorm's whole input (token + position), times
its weight; then ELECTRA's projection). The LayerNorm's shift and the q/k biases are left out: with them the
extra terms are constant along a query's row (softmax ignores them) or depend on the key's absolute position
alone, which no relative bias can express. With a one-hot bucket design, the least-squares fit of a bucket is
the mean of the scores of the (i, j) pairs in that bucket (j <= i for GPT-2); empty buckets get 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import PositionConfig
from ..portable.posswap_architectures import Sites
from ..portable.posswap_attention import bias_map
from ..portable.posswap_rules import boolean, choice, integer
from ..portable.posswap_rules import check as check_rule
from ..portable.posswap_t5 import INITS, t5_buckets
from ..registry import register_method
from .absolute import absolute_field, check_absolute, keep_table, planned_table_weight
from .backends import backend_field, check_attention_interface, check_bias_backend, resolve_bias_backend
from .table_logits import first_layer_position_scores, original_rows


@dataclass
class T5BiasConfig(PositionConfig):
    method = "t5-bias"

    num_buckets: int = field(
        default=32,
        metadata={
            "help": "Buckets of relative distance, one learned bias per bucket and head (T5: 32); encoders split them between both directions.",
            "rule": integer(4, 65536, required=True),
        },
    )
    max_distance: int = field(
        default=128,
        metadata={
            "help": "Distance at which the log-spaced buckets end; farther keys share the last bucket (T5: 128).",
            # T5's bucket function divides by log(max_distance / max_exact), max_exact = num_buckets / 4 or / 2.
            "rule": check_rule("max_distance_problem", required=True),  # portable/posswap_t5.py: > num_buckets // 2
        },
    )
    per_layer: bool = field(
        default=False,
        metadata={
            "help": "One bucket table per layer (true) or one shared by all layers, as T5 (false).",
            "rule": boolean(),
        },
    )
    absolute: str = absolute_field()
    init: str = field(
        default="zeros",
        metadata={
            "help": "How the new position parameters start: zeros, or fit (per-bucket means of the original's first-layer "
            "position-position logits).",
            "rule": choice(*INITS),
        },
    )
    backend: str | None = backend_field()


def check(model: nn.Module, sites: Sites, config: T5BiasConfig) -> None:
    check_attention_interface(sites, config.method)
    check_absolute(sites, config.absolute)
    if config.init == "fit" and sites.table is None:
        raise ValueError(
            "init='fit' fits the biases to the learned position table, but this model has none left. Use init='zeros'."
        )
    check_bias_backend(model, config.backend)


def apply(model: nn.Module, sites: Sites, config: T5BiasConfig) -> torch.Tensor | None:
    """A kept table grows by copy; returns the original table rows for ``init="fit"`` (the run time drops the
    table right after this)."""
    rows = original_rows(model, sites) if config.init == "fit" else None
    keep_table(sites, planned_table_weight(sites, config.absolute, config.max_length))
    config.backend = resolve_bias_backend(model, config.backend)  # recorded, so a loaded model runs the same kernel
    return rows


def initialize(model: nn.Module, sites: Sites, config: T5BiasConfig, rows: torch.Tensor | None) -> None:
    """Starting values of the bucket tables the run time created (empty, as in a model being loaded)."""
    values = torch.zeros(config.num_buckets, model.config.num_attention_heads)
    if rows is not None:
        values = fitted_biases(model, sites, rows, config)
    with torch.no_grad():
        for provider in sites.base.posswap_bias_providers:
            provider.relative_attention_bias.weight.copy_(values)  # every layer starts the same, shared or not


def fitted_biases(model: nn.Module, sites: Sites, rows: torch.Tensor, config: T5BiasConfig) -> torch.Tensor:
    """(num_buckets, heads): per head, the mean first-layer position-position logit of each bucket's pairs."""
    scores, _ = first_layer_position_scores(model, sites, rows)
    length = scores.shape[-1]
    positions = torch.arange(length)
    buckets = t5_buckets(
        positions[None, :] - positions[:, None], not sites.arch.causal, config.num_buckets, config.max_distance
    )
    pairs = torch.ones(length, length, dtype=torch.bool)
    pairs = pairs.tril() if sites.arch.causal else pairs  # GPT-2's queries never see later keys
    return bucket_means(scores[:, pairs], buckets[pairs], config.num_buckets).T.float()


def bucket_means(scores: torch.Tensor, buckets: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """(heads, pairs) scores, (pairs,) bucket ids -> (heads, num_buckets) means; 0 for a bucket with no pair."""
    sums = scores.new_zeros(scores.shape[0], num_buckets).index_add_(1, buckets, scores)
    counts = torch.bincount(buckets, minlength=num_buckets).clamp_min(1)
    return sums / counts


register_method(
    T5BiasConfig,
    check,
    apply,
    initialize,
    variants={"t5-bias": {}, "t5-bias-fit": {"init": "fit"}},
    position_map=bias_map,
    example=lambda n: T5BiasConfig(max_length=n, init="fit"),
)
