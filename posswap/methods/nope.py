"""``nope``: no positions at all. The learned table is dropped and nothing takes its place.

For GPT-2 this is NoPE (Kazemnejad et al., 2023: the causal mask alone tells the model where it is). An encoder
without positions is permutation-equivariant: shuffling the tokens shuffles the outputs the same way. That is the
ablation, so it is allowed, with a warning.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from torch import nn

from ..config import PositionConfig
from ..portable.posswap_architectures import Sites
from ..portable.posswap_nope import no_map
from ..registry import register_method


@dataclass
class NopeConfig(PositionConfig):
    method = "nope"


def check(model: nn.Module, sites: Sites, config: NopeConfig) -> None:
    """Nothing can be refused: any model can lose its positions."""


def apply(model: nn.Module, sites: Sites, config: NopeConfig) -> None:
    """No weight change: posswap.patch then drops the table at run time, as a saved model's class does."""
    if not sites.arch.causal:
        warnings.warn(
            f"posswap: NoPE on {sites.arch.model_type}, a bidirectional encoder: without positions it is "
            "permutation-equivariant (token order cannot change its outputs). That is the no-positions ablation; "
            "for a usable long-context encoder use rope, alibi, sinusoidal or interpolate.",
            UserWarning,
            stacklevel=3,  # the caller of posswap.patch
        )


register_method(
    NopeConfig, check, apply, variants={"nope": {}}, position_map=no_map, example=lambda n: NopeConfig(max_length=n)
)
