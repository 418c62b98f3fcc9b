"""A clear error for inputs longer than a patched model reads, instead of an IndexError (CPU) or a device
assert (CUDA) from inside ``nn.Embedding``. Installed on the base model by :func:`posswap.patch`
and by the classes of saved models. Travels with saved models, so it imports nothing from posswap."""

from __future__ import annotations

import inspect

import torch
from torch import nn


class LengthGuard:
    """Forward pre-hook: checks the positions an input needs against ``config.max_position_embeddings``."""

    def __init__(self, base: nn.Module, offset: int):
        self.signature = inspect.signature(type(base).forward)
        self.offset = offset

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = self.signature.bind_partial(module, *args, **kwargs).arguments
        rows = module.config.max_position_embeddings
        position_ids = bound.get("position_ids")
        if position_ids is not None:
            _check_position_ids(position_ids)
            # Explicit ids (generate, packing, PoSE) already include any offset.
            if position_ids.numel() and int(position_ids.max()) >= rows:
                self._fail(module, int(position_ids.max()) + 1 - self.offset)
            return
        tokens = bound.get("input_ids")
        if tokens is None:
            tokens = bound.get("inputs_embeds")
        if tokens is None:
            return  # the model itself reports the missing input
        cache = bound.get("past_key_values")
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


def _check_position_ids(position_ids) -> None:
    # A rotation or a bias takes any number, so a float or negative id would run and give wrong outputs.
    if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or position_ids.is_complex():
        kind = position_ids.dtype if isinstance(position_ids, torch.Tensor) else type(position_ids).__name__
        raise ValueError(f"position_ids must be an integer tensor (torch.long), got {kind}.")
    if position_ids.numel() and int(position_ids.min()) < 0:
        raise ValueError(f"position_ids must be >= 0, got {int(position_ids.min())}.")


def install_length_guard(base: nn.Module, offset: int) -> None:
    """Idempotent: patching twice keeps one guard."""
    if any(isinstance(hook, LengthGuard) for hook in base._forward_pre_hooks.values()):
        return
    base.register_forward_pre_hook(LengthGuard(base, offset), with_kwargs=True)
