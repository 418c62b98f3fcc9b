"""``tupe``: TUPE (Ke et al., ICLR 2021). The learned table leaves the input sum; every layer adds the untied
positional correlation ``(p_i U_Q) . (p_j U_K) / sqrt(2 d_head)`` (shared by the layers), with the [CLS] reset
and, with ``relative``, T5's bucketed relative bias (TUPE-R). The run time is ``portable/posswap_tupe.py``.

Scaling: the content term keeps the model's own ``1/sqrt(d_head)``; the paper's ``1/sqrt(2d)`` on it is for
training from scratch, and rescaling it would change every layer at step 0. The new term uses ``1/sqrt(2d)``
and starts as the original first layer's position-position term (U = 2^(1/4) W).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..config import PositionConfig
from ..memory import resampled_table_bytes_per_row
from ..portable.posswap_architectures import Sites
from ..portable.posswap_functional import RESAMPLE_MODES
from ..portable.posswap_rules import boolean, choice
from ..portable.posswap_tupe import tupe_map
from ..registry import register_method
from .architectures import embedding_projection, first_layer_qk
from .backends import backend_field, check_attention_interface, check_bias_backend, resolve_bias_backend
from .interpolate import resized_table_weight


@dataclass
class TupeConfig(PositionConfig):
    method = "tupe"

    cls_reset: bool | None = field(
        default=None,
        metadata={
            "help": "Replace the correlations from and to position 0 ([CLS]) by two learned scalars per head; default: on for encoders, off for GPT-2.",
            "rule": boolean(required=True, before_apply=(None,)),
        },
    )
    relative: bool = field(
        default=False,
        metadata={
            "help": "TUPE-R: also add T5's learned bucketed relative bias (32 buckets, max distance 128), zero at the start.",
            "rule": boolean(),
        },
    )
    mode: str = field(
        default="copy",
        metadata={
            "help": "How the learned table grows to max_length: copy (tile the old rows), linear or cubic (resample it), "
            "hierarchical (old row p % old plus a block vector), as interpolate's mode (its stride options are "
            "interpolate's alone).",
            "rule": choice(*RESAMPLE_MODES),
        },
    )
    backend: str | None = backend_field()

    def bytes_per_row(self, sites: Sites) -> int:
        return resampled_table_bytes_per_row(sites)  # the table resized to max_length


def check(model: nn.Module, sites: Sites, config: TupeConfig) -> None:
    check_attention_interface(sites, config.method)
    if sites.table is None:
        raise ValueError(
            "tupe starts from the learned position table, but this model has none left (a method dropped it). "
            "Start from the original checkpoint."
        )
    check_bias_backend(model, config.backend)


def apply(model: nn.Module, sites: Sites, config: TupeConfig) -> torch.Tensor:
    """Resolves the defaults into the config (so the saved block says what ran); returns the table extended to
    max_length (real positions only), read before the run time drops it."""
    config.backend = resolve_bias_backend(model, config.backend)
    if config.cls_reset is None:
        config.cls_reset = not sites.arch.causal
    return resized_table_weight(sites, config.max_length, config.mode)[sites.table_offset :]


def _first_layer_qk(sites: Sites) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q and W_K of the first self-attention, seen from the table's width (through ELECTRA's projection)."""
    w_q, w_k = first_layer_qk(sites)
    projection = embedding_projection(sites)
    if projection is not None:
        into = projection.weight.detach().t()  # (table_dim, hidden)
        w_q, w_k = into @ w_q, into @ w_k
    return w_q, w_k


@torch.no_grad()
def initialize(model: nn.Module, sites: Sites, config: TupeConfig, table: torch.Tensor) -> None:
    provider = sites.base.posswap_bias_providers[0]
    w_q, w_k = _first_layer_qk(sites)
    provider.positions.copy_(table)
    # 2^(1/4) on each: the term's 1/sqrt(2d) then equals the original's 1/sqrt(d) at step 0.
    provider.query.copy_(w_q * 2**0.25)
    provider.key.copy_(w_k * 2**0.25)
    if provider.relative is not None:
        provider.relative.relative_attention_bias.weight.zero_()
    if config.cls_reset:
        # theta_1 / theta_2 start as the mean correlation they replace, over the positions the model was trained at.
        old = torch.arange(min(sites.config.posswap["original_length"], config.max_length), device=table.device)[None]
        provider.cls_reset = False
        full = provider.correlation(old, old)[0]  # (heads, n, n), without the reset
        provider.cls_reset = True
        provider.cls_to_others.copy_(full[:, 0, :].mean(-1))
        provider.others_to_cls.copy_(full[:, 1:, 0].mean(-1) if full.shape[-1] > 1 else full[:, 0, 0])


# Its correlation comes from the (copied) table, so it reads no further than the table.
register_method(
    TupeConfig,
    check,
    apply,
    initialize,
    variants={"tupe": {}},
    extends_table=True,
    position_map=tupe_map,
    example=lambda n: TupeConfig(max_length=n, relative=True),
)
