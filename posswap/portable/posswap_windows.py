"""The keys each head of a shift-invariant bias can weigh, and the SDPA calls that read only those (CPU, blocked
paths of ``posswap_blocked.py`` and ``posswap_blocked_grad.py``).

A key whose bias alone is more than ``NEGLIGIBLE`` + (the most its content can add) below the bias of the query's
own key weighs under e^-60 of it: nothing an fp32 sum holds. Its weight is also, between e^-104 and e^-87, a
denormal number, which x86 cores compute about a hundred times slower unless the thread flushes them (torch leaves
that off, per thread): ALiBi's far keys made its training step at 4k tokens 2.9x the stock model's. So such keys
get lowest, and a head that weighs only keys within ``before`` positions behind (``after`` ahead) reads only those:
ALiBi's steepest heads (slope 1/2, 1/4, ...) read a few hundred keys at any length, as a sliding window would.

The calls: queries in blocks of ``FAST_ROWS``; in each block, neighbouring heads whose windows cut the same keys
share a call (an encoder's heads that read every key: one call over all queries). CPU's flash backward shares out
only batch x heads over threads, so a call of one head would keep one thread: with a batch of one, each call's
queries are split in the batch dimension, the parts reading the same keys (a stride-0 batch) and their bias a
strided view of the same vector. (Stacking a narrow head's interior blocks in the batch instead needs their bias in
key order, a copy per call: slower on one thread, measured.)

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

# A key whose weight is under e^-60 of the largest in its row adds nothing an fp32 sum can hold (e^-60 ~ 1e-26).
NEGLIGIBLE = 60.0
# Query rows per SDPA call. A decoder's block computes half a block of masked scores (stock's is_causal skips them),
# so smaller is less work; but every call is a parallel region, and CPU's flash kernel tiles 64 query rows below 768
# queries (256 from 768 on). Measured at 2k and 4k tokens (reference GPT-2, one thread): 256-512 rows cost
# 1.07-1.14x stock's attention, 768 1.12-1.28x, 1024 1.19-1.32x.
FAST_ROWS = 512
# The fewest query rows of one part of a split call (the flash kernel's query tile below 768 queries).
MIN_PART = 64


@dataclass(frozen=True)
class Window:
    """Heads ``heads`` weigh keys at most ``before`` positions behind the query and ``after`` ahead of it."""

    heads: slice
    before: int
    after: int


@dataclass(frozen=True)
class Call:
    """One SDPA call: heads ``heads``, queries ``start`` .. ``start + rows`` (indices among the queries) against the
    keys at positions ``first`` .. ``end``; with ``split`` > 1 (batch 1), the queries in that many equal parts in
    the batch dimension, each against the same keys."""

    heads: slice
    start: int
    rows: int
    first: int
    end: int
    split: int = 1


def reach(vector: torch.Tensor, zero_at: int, query, key, scaling: float) -> tuple[torch.Tensor, list[Window]]:
    """``vector`` (heads, W), the bias by distance (column ``zero_at``: distance 0, read by every query on the routes
    that call this: contiguous positions, queries last, no padding), with lowest on every negligible key; and the
    heads in groups with the keys each group weighs. What a key's content can add is bounded per head by
    q.(k_j - k_i) <= |q| (|k_j| + |k_i|), with the largest norms among the head's queries and keys."""
    with torch.no_grad():
        heads = vector.shape[0]
        q_norm, k_norm = query.norm(dim=-1).amax(dim=(0, 2)), key.norm(dim=-1).amax(dim=(0, 2))
        if q_norm.shape[0] != heads or k_norm.shape[0] != heads:  # grouped keys: one bound for every head
            q_norm, k_norm = q_norm.amax().expand(heads), k_norm.amax().expand(heads)
        bound = NEGLIGIBLE + 2 * scaling * q_norm * k_norm
        negligible = vector < vector[:, zero_at : zero_at + 1] - bound[:, None]
        distance = torch.arange(vector.shape[1], device=vector.device) - zero_at  # query minus key, per column
        kept = torch.where(negligible, 0, distance)
        windows = group_heads(kept.amax(1).clamp(min=0).tolist(), (-kept).amax(1).clamp(min=0).tolist())
        if bool(negligible.any()):
            vector = vector.masked_fill(negligible, torch.finfo(vector.dtype).min)
        return vector, windows


def group_heads(before: list[int], after: list[int]) -> list[Window]:
    """Neighbouring heads in one group while the group's widest window costs at most a tenth more than each head's
    own (a block of ``FAST_ROWS`` queries reads its rows and the window's keys)."""
    windows: list[Window] = []
    for h, span in enumerate(zip(before, after)):
        if windows:
            last = windows[-1]
            merged = (max(last.before, span[0]), max(last.after, span[1]))
            count = last.heads.stop - last.heads.start
            own = count * (FAST_ROWS + last.before + last.after) + FAST_ROWS + sum(span)
            if (count + 1) * (FAST_ROWS + sum(merged)) <= 1.1 * own:
                windows[-1] = Window(slice(last.heads.start, h + 1), *merged)
                continue
        windows.append(Window(slice(h, h + 1), *span))
    return windows


def plan_calls(windows: list[Window], q_len: int, k_len: int, causal: bool, batch: int) -> list[Call]:
    """Every SDPA call of one attention: per block of queries, each group's keys (a decoder's none after the
    block's last query), neighbouring groups with the same keys in one call, the same keys for neighbouring blocks
    in one call (an encoder's heads that read everything: one call); each split for the threads."""
    past, calls = k_len - q_len, []
    for start in range(0, q_len, FAST_ROWS):
        stop = min(q_len, start + FAST_ROWS)
        for window in windows:
            first, end = past + start - window.before, past + stop + (0 if causal else window.after)
            _merge(calls, Call(window.heads, start, stop - start, max(0, first), min(k_len, end)))
    return [dataclasses.replace(call, split=_split(call, batch)) for call in calls]


def _split(call: Call, batch: int) -> int:
    """Parts of a call's queries so that CPU's flash backward, which splits only batch x heads over threads, has
    an even share for each thread, at least two (batch 1 only: the parts share the keys by a stride-0 batch)."""
    threads, heads = torch.get_num_threads(), call.heads.stop - call.heads.start
    if batch > 1 or threads == 1:
        return 1
    for split in (1, 2, 4, 8):
        if heads * split >= 2 * threads and heads * split % threads == 0:
            break
    while split > 1 and (call.rows % split or call.rows // split < MIN_PART):
        split //= 2
    return split


def _merge(calls: list[Call], call: Call) -> None:
    """Append ``call``, or widen the last call of the same keys by its heads (same rows) or by its rows (same
    heads)."""
    last = calls[-1] if calls else None
    if last is None or (last.first, last.end) != (call.first, call.end):
        calls.append(call)
    elif (last.start, last.rows) == (call.start, call.rows) and last.heads.stop == call.heads.start:
        calls[-1] = Call(slice(last.heads.start, call.heads.stop), call.start, call.rows, call.first, call.end)
    elif last.heads == call.heads and last.start + last.rows == call.start:
        calls[-1] = Call(call.heads, last.start, last.rows + call.rows, call.first, call.end)
    else:
        calls.append(call)


def rows_of(x: torch.Tensor, call: Call) -> torch.Tensor:
    """The call's queries (or outputs, log-sum-exps, their gradients) of ``x`` (b, heads, q, ...): a view, (b,
    heads, rows, ...), or (split, heads, rows / split, ...)."""
    if call.split == 1:
        return x[:, call.heads, call.start : call.start + call.rows]
    strides, part = x.stride(), call.rows // call.split
    shape = (call.split, call.heads.stop - call.heads.start, part, *x.shape[3:])
    offset = x.storage_offset() + call.heads.start * strides[1] + call.start * strides[2]
    return x.as_strided(shape, (part * strides[2], *strides[1:]), offset)


def keys_of(x_reversed: torch.Tensor, call: Call) -> torch.Tensor:
    """The call's keys (or values) in reverse order, as :func:`bias_of` lays out its bias (each part: the same)."""
    k_len = x_reversed.shape[2]
    keys = x_reversed[:, call.heads, k_len - call.end : k_len - call.first]
    return keys if call.split == 1 else keys.expand(call.split, -1, -1, -1)


def add_keys(grad_reversed: torch.Tensor, call: Call, value: torch.Tensor) -> None:
    """Adds a call's key (or value) gradients, laid out as :func:`keys_of` gives them, to ``grad_reversed``."""
    k_len = grad_reversed.shape[2]
    grad_reversed[:, call.heads, k_len - call.end : k_len - call.first] += (
        value if call.split == 1 else value.sum(0, keepdim=True)  # the parts read the same keys
    )


def bias_of(vector: torch.Tensor, zero_at: int, call: Call, past: int) -> torch.Tensor:
    """The call's bias from ``vector`` (heads, W; distance 0 at column ``zero_at``), (split, heads, rows / split,
    keys) over the keys in reverse order: key jj is at position end - 1 - jj, and the bias of row r is column
    r + jj + (past + start) - end + 1 + zero_at: a Hankel matrix, an ``as_strided`` view (strides 1, 1; a part
    later by its rows) of the vector, which CPU's flash kernel reads through its mask strides: no copy."""
    step, part = vector.stride(0), call.rows // call.split
    offset = vector.storage_offset() + call.heads.start * step + past + call.start - call.end + 1 + zero_at
    shape = (call.split, call.heads.stop - call.heads.start, part, call.end - call.first)
    return vector.as_strided(shape, (part, step, 1, 1), offset)
