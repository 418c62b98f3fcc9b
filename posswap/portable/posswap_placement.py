"""LongEmbed's E5-Base-4k placement at run time (``interpolate`` with ``exact_short_inputs``): an input that fits
the original length reads exactly the rows the model was trained with.

The ``stride`` table puts old row i at position k * i (k = max_length // original_length). A long input reads every
row; an input within the original length has its position ids multiplied by k, so it reads the old rows only and the
patched model gives it the original model's outputs. Which rows are short is decided per row of the batch, from the
attention mask (its real tokens), so padding a short text beside a long one does not move it. Explicit
``position_ids`` (packing, a caller's own numbering) are placed the same way: a row whose ids all lie within the
original length (those of its real tokens) reads old row i at k * i, as the original model reads position i.

With ``stride_per_length`` a longer row is read at the widest whole step its length leaves room for,
``max_length // n`` for n real tokens (at most k): a 1024-token input of a 2048-token model at every second
position, where the plain rule reads it at every position (each old row then covers k tokens at every length).

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
    by k in a row of at most ``original_length`` real tokens (by the row's step, :func:`row_steps`, in every row
    with ``stride_per_length``). ``tokens``: the input ids, or the input embeddings.

    Counted as the stock model counts: BERT's family from the first token, pads included; RoBERTa's
    (``offset`` > 0, its padding rows) over real tokens only, pads reading the padding row ``pad_token_id``.
    Padding past a short row's end would reach past the table at k * i: it is clamped to the last row (its
    outputs are masked). That clamp holds only at indices within the table: a token at an index past it gets the
    id ``offset + index``, past the last row, so that an input longer than the model reads is refused as a model
    without this placement refuses it (in torch by the length guard, which checks these ids, with its message; in
    an ONNX graph by the table's Gather), never read at the last row."""
    batch, length = tokens.shape[:2]
    device = tokens.device
    steps = torch.arange(length, device=device).expand(batch, length)
    pads = None
    if offset and not tokens.is_floating_point() and pad_token_id is not None:
        real = tokens != pad_token_id
        steps, pads = (real.cumsum(-1) - 1).clamp(min=0), ~real
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 2:
        real_tokens = attention_mask.to(device).long().sum(-1)
    else:  # no mask (or a prepared 4-d one): every token that is not a pad is real
        real_tokens = torch.full((batch,), length, device=device) if pads is None else (~pads).sum(-1)
    ids = (steps * row_steps(real_tokens, block)[:, None] + offset).clamp(max=rows - 1)
    ids = ids if pads is None else ids.masked_fill(pads, pad_token_id)
    index = torch.arange(length, device=device) + offset
    return torch.where(index < rows, ids, index)  # within the table: unchanged


def row_steps(real_tokens: torch.Tensor, block: dict) -> torch.Tensor:
    """(batch,) the step between two tokens' positions in a row of ``real_tokens`` tokens: k within the original
    length, beyond it 1, or with ``stride_per_length`` the widest whole step that stays within ``max_length``."""
    length = block["max_length"] // (block.get("stride_blocks") or 1)  # one stride table's rows
    stride = length // block["original_length"]
    if block.get("stride_per_length"):
        real_tokens = real_tokens.clamp(min=1)
        # the length as a tensor: torch's ONNX exporter has no int // tensor
        return (torch.full_like(real_tokens, length) // real_tokens).clamp(min=1, max=stride)
    return torch.where(real_tokens <= block["original_length"], stride, 1)


def explicit_position_ids(position_ids, tokens: torch.Tensor, attention_mask, block: dict, offset: int):
    """The caller's ``position_ids`` placed: in a row whose ids (of its real tokens) are all within
    ``original_length``, id ``offset + i`` becomes ``offset + k * i``, the old row the original model reads at
    ``i``; a row reaching further reads the table as it is (with ``stride_per_length``, id ``offset + i`` becomes
    ``offset + s * i``, s the step of a row of its reach + 1 tokens). None where the ids are not a (batch or 1, length)
    integer tensor of the input's length: the length guard refuses those, naming them."""
    batch, length = tokens.shape[:2]
    if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() or position_ids.is_complex():
        return None
    if position_ids.dim() not in (1, 2) or position_ids.shape[-1] != length or position_ids.numel() == 0:
        return None
    ids = position_ids if position_ids.dim() == 2 else position_ids[None]
    if ids.shape[0] not in (1, batch):
        return None
    steps = ids - offset
    counted = steps >= 0  # RoBERTa's padding rows (ids below the offset) are no position
    if (
        isinstance(attention_mask, torch.Tensor)
        and attention_mask.dim() == 2
        and attention_mask.shape == (batch, length)
    ):
        counted = counted & attention_mask.to(ids.device).bool()  # each row of the batch by its own real tokens
    reach = torch.where(counted, steps, torch.zeros_like(steps)).amax(-1, keepdim=True)
    step = row_steps(reach + 1, block)
    placed = (steps >= 0) & (steps * step < block["max_length"])  # a pad numbered past the table stays
    return torch.where(placed, offset + steps * step, ids)


class ShortInputPositions:
    """Forward pre-hook on the base model: the call's ``position_ids``, placed: built when the caller gave none,
    the caller's own (as from packing) moved to the old rows in a row that stays within the original length. An
    object, not a closure: deepcopy and pickling carry it."""

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
        if tokens is None or passed_cache(features) is not None:
            return None
        mask, pad, given = features.get("attention_mask"), base.config.pad_token_id, features.get("position_ids")
        if given is not None:
            return explicit_position_ids(given, tokens, mask, block, self.offset)
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
