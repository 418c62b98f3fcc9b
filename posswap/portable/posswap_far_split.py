"""The backward pass of a decoder's training attention whose far distances all read one parameter (T5's last
bucket), on CPU: the far keys' gradients through torch's own causal kernel, the near ones (the band) by hand.

With every distance from ``far`` on sharing the bias ``c`` (per head), a query's keys split in two: the band
(distances 0 .. far - 1, each its own bias) and the far keys (distance far and more, bias ``c`` for all). For the far
keys the bias is a constant, which a softmax takes as a shift of the log-sum-exp: query ``i`` weighs keys
``j <= i - far`` as plain causal attention of queries ``far ..`` against keys ``.. n - far`` does (the stock model's
``is_causal`` kernel: no mask read, the upper triangle skipped). Given the whole attention's output and log-sum-exp
(the forward pass's, ``posswap_blocked_grad``), each part's gradients are its keys' share: torch's flash backward for
the far part (its log-sum-exp less ``c``), and for the band blocks of ``far / 2`` queries by hand, whose score
gradients also give the table its gradient (a row's score gradients sum to zero, so the far bucket's is minus the
band's). At 4k tokens and T5's 128 the band is a tenth of a causal row's keys. (The forward pass split the same way
was slower than the blocked path's own forward, whose windows read the bias as a strided view: measured.)

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch

from . import posswap_blocked

_FLASH, _FLASH_BACKWARD = posswap_blocked.CPU_FLASH, posswap_blocked.CPU_FLASH_BACKWARD

# exp below e^-87 gives a denormal, which x86 computes many times slower (posswap_windows.py); a weight that small
# (under 1.2e-38) adds nothing an fp32 gradient holds, so the argument is clamped there.
SMALLEST_EXP = -87.0


def applies(plan, query: torch.Tensor, key: torch.Tensor) -> bool:
    """Causal, every key a query (no cache), contiguous unpadded positions, no dropout, a far bucket nearer than
    the last key, and torch's CPU flash kernels."""
    n = query.shape[2]
    return (
        _FLASH is not None
        and plan.far is not None
        and plan.causal
        and plan.mask is None
        and plan.q_pos is None
        and plan.dropout <= 0
        and n == key.shape[2]
        and 0 < plan.far < n
    )


def backward(saved: tuple, grad_out, table, plan, d_table) -> tuple[torch.Tensor, ...]:
    """q, k, v gradients (and the table's into ``d_table``, when given) of the attention whose output and
    log-sum-exp ``saved`` holds (with q, k, v); ``table``: the bias per distance the forward read."""
    query, key, value, out, lse = saved
    n, far = query.shape[2], plan.far
    grads = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    band_gradients(d_table, plan, table, saved, grad_out, grads)
    far_grads = _FLASH_BACKWARD(
        grad_out[:, :, far:].contiguous(), *_far_inputs(query, key, value, far), out[:, :, far:].contiguous(),
        (lse[:, :, far:] - _far_bias(table, plan)).contiguous(), 0.0, True, scale=plan.scaling,
    )  # fmt: skip
    grads[0][:, :, far:] += far_grads[0]
    grads[1][:, :, : n - far] += far_grads[1]
    grads[2][:, :, : n - far] += far_grads[2]
    return grads


def _far_inputs(query, key, value, far: int) -> tuple[torch.Tensor, ...]:
    """Queries ``far ..`` and keys / values ``.. n - far``: query ``far + r`` weighs key ``j <= r``, is_causal's
    square."""
    n = query.shape[2]
    return query[:, :, far:], key[:, :, : n - far], value[:, :, : n - far]


def _far_bias(table, plan) -> torch.Tensor:
    """(heads, 1): the bias every far key reads, the column of distance ``far``."""
    return table[:, plan.far - plan.lo, None]


def band_gradients(d_table, plan, table, saved: tuple, grad_out, grads: tuple | None = None) -> None:
    """The table's gradient into ``d_table`` (when given) when every causal distance from ``plan.far`` on reads one
    parameter, and with ``grads`` (dq, dk, dv) the band keys' share of those added. Each nearer distance gets its own
    sum of score gradients, made over the keys within ``far`` of each query; a row's other score gradients sum to
    minus those (a softmax's score gradients sum to zero along a row), and that total goes to the column of
    distance ``far``, which stands for all of them. Blocks of ``far / 2`` queries read ``far / 2 + far - 1`` keys."""
    query, key, value, out, lse = saved
    q_len, k_len, far, lo = query.shape[2], key.shape[2], plan.far, plan.lo
    delta = (grad_out * out).sum(-1, keepdim=True)
    rows = max(posswap_blocked.MIN_ROWS, far // 2)
    block_bias = {}  # every full block past the first ``far`` positions has the same distances: one bias for them
    for start in range(0, q_len, rows):
        stop = min(q_len, start + rows)
        first = k_len - q_len + start  # the block's first query's position: the queries are the last keys
        k0, k1 = max(0, first - far + 1), first + stop - start
        shape = (first - k0, stop - start, k1 - k0)
        if shape not in block_bias:
            block_bias[shape] = _block_bias(table, shape, far, lo)
        bias, inside, columns = block_bias[shape]
        q, k, v = query[:, :, start:stop], key[:, :, k0:k1], value[:, :, k0:k1]
        scores = torch.matmul(q * plan.scaling, k.transpose(-1, -2)).add_(bias).sub_(lse[:, :, start:stop, None])
        probs = scores.clamp_(min=SMALLEST_EXP).exp_().mul_(inside)  # 0 past the band (and behind it)
        d_out = grad_out[:, :, start:stop]
        d_scores = torch.matmul(d_out, v.transpose(-1, -2)).sub_(delta[:, :, start:stop]).mul_(probs)
        if grads is not None:
            grads[0][:, :, start:stop] += torch.matmul(d_scores, k).mul_(plan.scaling)
            grads[1][:, :, k0:k1] += torch.matmul(d_scores.transpose(-1, -2), q).mul_(plan.scaling)
            grads[2][:, :, k0:k1] += torch.matmul(probs.transpose(-1, -2), d_out)
        if d_table is not None:
            _add_table_grad(d_table, d_scores.sum(0), columns, max(0, far - first), far - lo)


def _block_bias(table, shape: tuple[int, int, int], far: int, lo: int) -> tuple[torch.Tensor, ...]:
    """A block's (heads, rows, keys) bias, its 0/1 band (distance 0 .. far - 1) and the table column of each
    (row, key), flat: ``shape`` = (first query's distance to the first key, rows, keys)."""
    distance = torch.arange(shape[0], shape[0] + shape[1])[:, None] - torch.arange(shape[2])[None]  # CPU path
    inside = ((distance >= 0) & (distance < far)).to(table.dtype)
    return table[:, distance.clamp(0, far) - lo], inside, (distance - lo).reshape(-1)


def _add_table_grad(d_table, d_scores, columns, beyond: int, far_column: int) -> None:
    """A block's (heads, rows, keys) score gradients, batch summed, per distance; the rows from ``beyond`` on have
    keys at distance far and more, whose share is minus their band's."""
    d_table.index_add_(1, columns, d_scores.reshape(d_scores.shape[0], -1))
    if beyond < d_scores.shape[1]:
        d_table[:, far_column] -= d_scores[:, beyond:].sum((1, 2))
