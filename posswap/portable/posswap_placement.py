"""LongEmbed's E5-Base-4k placement at run time (``interpolate`` with ``exact_short_inputs``): an input that fits
the original length reads exactly the rows the model was trained with.

The ``stride`` table puts old row i at position k * i (k = max_length // original_length). A long input reads every
row; an input within the original length has its position ids multiplied by k, so it reads the old rows only and the
patched model gives it the original model's outputs. Which rows are short is decided per row of the batch, from the
attention mask (its real tokens), so padding a short text beside a long one does not move it.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from .posswap_hooks import call_arguments, find_hooks, passed_cache


def short_input_position_ids(
    tokens: torch.Tensor, attention_mask, block: dict, offset: int, rows: int, pad_token_id=None
) -> torch.Tensor:
    """(batch, length) position ids: the stock model's, with the position counted from the first token multiplied
    by k in a row of at most ``original_length`` real tokens. ``tokens``: the input ids, or the input embeddings.

    Counted as the stock model counts: BERT's family from the first token, pads included; RoBERTa's
    (``offset`` > 0, its padding rows) over real tokens only, pads reading the padding row ``pad_token_id``.
    Padding past a short row's end would reach past the table at k * i: it is clamped to the last row (its
    outputs are masked)."""
    batch, length = tokens.shape[:2]
    device = tokens.device
    stride = block["max_length"] // block["original_length"]
    steps = torch.arange(length, device=device).expand(batch, length)
    pads = None
    if offset and not tokens.is_floating_point() and pad_token_id is not None:
        real = tokens != pad_token_id
        steps, pads = (real.cumsum(-1) - 1).clamp(min=0), ~real
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        real_tokens = attention_mask.to(device).long().sum(-1)
    else:  # no mask (or a prepared 4-d one): every token that is not a pad is real
        real_tokens = torch.full((batch,), length, device=device) if pads is None else (~pads).sum(-1)
    short = (real_tokens <= block["original_length"])[:, None]
    ids = (torch.where(short, steps * stride, steps) + offset).clamp(max=rows - 1)
    return ids if pads is None else ids.masked_fill(pads, pad_token_id)


class ShortInputPositions:
    """Forward pre-hook on the base model: the call's ``position_ids`` when the caller gave none (explicit ones, as
    from packing, are the caller's own). An object, not a closure: deepcopy and pickling carry it."""

    def __init__(self, base: nn.Module, offset: int):
        self.signature = inspect.signature(type(base).forward)
        self.offset = offset

    def position_ids(self, base: nn.Module, features: dict) -> torch.Tensor | None:
        """The ids for a call with these inputs, or None where the model's own apply (explicit ids, a KV cache)."""
        tokens = features.get("input_ids")
        if tokens is None:
            tokens = features.get("inputs_embeds")
        block, rows = getattr(base.config, "posswap", None) or {}, base.config.max_position_embeddings
        if not block.get("exact_short_inputs"):  # re-patched without it since
            return None
        if features.get("position_ids") is not None or tokens is None or passed_cache(features) is not None:
            return None
        mask, pad = features.get("attention_mask"), base.config.pad_token_id
        return short_input_position_ids(tokens, mask, block, self.offset, rows, pad)

    def __call__(self, base: nn.Module, args: tuple, kwargs: dict):
        features = call_arguments(self.signature, base, args, kwargs)
        ids = self.position_ids(base, features)
        if ids is None:
            return None
        # Everything by keyword: position_ids may sit among the positional arguments.
        return (), {**features, "position_ids": ids}


def install_short_input_positions(base: nn.Module, offset: int) -> None:
    """Idempotent. Registered before the length guard, which then checks the ids it set."""
    if not find_hooks(base, ShortInputPositions):
        base.register_forward_pre_hook(ShortInputPositions(base, offset), with_kwargs=True, prepend=True)
