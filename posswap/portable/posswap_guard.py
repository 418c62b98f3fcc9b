"""A clear error for inputs longer than a patched model reads, instead of an IndexError (CPU) or a device
assert (CUDA) from inside ``nn.Embedding``. Installed on the base model by :func:`posswap.patch`
and by the classes of saved models. Travels with saved models, so it imports nothing from posswap."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from .posswap_hooks import call_arguments, passed_cache


class LengthGuard:
    """Forward pre-hook: checks the positions an input needs against ``config.max_position_embeddings``."""

    def __init__(self, base: nn.Module, offset: int):
        self.signature = inspect.signature(type(base).forward)
        self.offset = offset

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = call_arguments(self.signature, module, args, kwargs)
        rows = module.config.max_position_embeddings
        position_ids = bound.get("position_ids")
        tokens = bound.get("input_ids")
        if tokens is None:
            tokens = bound.get("inputs_embeds")
        if position_ids is not None:
            _check_position_ids(position_ids, tokens)
            # Explicit ids (generate, packing, PoSE) already include any offset.
            if position_ids.numel() and int(position_ids.max()) >= rows:
                self._fail(module, int(position_ids.max()) + 1 - self.offset)
            return
        if tokens is None:
            return  # the model itself reports the missing input
        cache = passed_cache(bound)  # by name, or in **kwargs
        length = tokens.shape[1] + (cache.get_seq_length() if cache is not None else 0)
        if length + self.offset > rows:
            self._fail(module, length)

    def _fail(self, module: nn.Module, length: int) -> None:
        limit = module.config.max_position_embeddings - self.offset
        raise ValueError(
            f"The input needs {length} positions but this {module.config.model_type} model reads at most {limit} "
            f"tokens. Truncate the input, or raise the limit with posswap.patch(model, "
            f"posswap.InterpolateConfig(max_length=...)) (or RopeConfig / AlibiConfig) before running it."
        )


def _check_position_ids(position_ids, tokens) -> None:
    # A rotation or a bias takes any number, so a float or negative id would run and give wrong outputs.
    if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or position_ids.is_complex():
        kind = position_ids.dtype if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids must be an integer tensor (torch.long), got {kind}.")
    if tokens is not None and tokens.dim() >= 2:
        # A bias or a dropped table would run with any count (taking the first or last ids); stock models raise.
        batch, length = tokens.shape[0], tokens.shape[1]
        if position_ids.dim() not in (1, 2) or position_ids.shape[-1] != length:
            raise ValueError(
                f"position_ids has {position_ids.shape[-1] if position_ids.dim() else 0} positions per sequence but the "
                f"input has {length} tokens: give one position per token (position_ids of shape (batch, {length}))."
            )
        if position_ids.dim() == 2 and position_ids.shape[0] not in (1, batch):
            raise ValueError(
                f"position_ids has {position_ids.shape[0]} rows but the input has a batch of {batch}: give one row per "
                "sequence, or one row for all."
            )
    if position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got {int(position_ids.min())}.")


def install_length_guard(base: nn.Module, offset: int) -> None:
    """Idempotent: patching twice keeps one guard."""
    if any(isinstance(hook, LengthGuard) for hook in base._forward_pre_hooks.values()):
        return
    base.register_forward_pre_hook(LengthGuard(base, offset), with_kwargs=True)
