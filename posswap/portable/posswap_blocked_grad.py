"""Training attention for the bias methods (ALiBi, T5 bias, TUPE-R) on CPU that never builds the whole
(heads, q, k) bias nor its gradient: FlashAttention's scheme in PyTorch ops.

The dense path (``posswap_attention.additive_mask``) builds one (b|1, heads, q, k) bias+mask per forward; with
gradients autograd also keeps it and makes a gradient of the same size, and SDPA given a mask cannot skip a
decoder's upper triangle. At 4k tokens that cost T5 bias 4.6x the stock model's training step and ALiBi 1.6x.

Here every bias that depends on ``q_pos - k_pos`` only is a gather from a small *distance table* (heads, W):
``bias[b, h, i, j] = table[h, q_pos[b, i] - k_pos[b, j] - lo]``, the table made by the provider from the
distances ``lo .. lo + W - 1`` (so autograd carries its gradient on to T5's bucket table). :class:`BlockedBiasAttention`
takes queries in blocks: forward saves q, k, v, the output and the log-sum-exp of each row; backward builds each
block's scores again and gives q, k, v and the table their gradients (the table's: the scores' gradient summed
per distance with ``index_add_``). Keys are taken in reverse order, so that with contiguous positions a block's
bias is a strided view of the table (as on the inference path, ``posswap_blocked.py``): no copy at all. A decoder's
block sees no key after its last query (the causal cut), which stock's ``is_causal`` gets and a dense mask loses.
With contiguous positions, no padding and no dropout, the blocks are ``posswap_windows.plan_calls``'s: each group of
heads over the keys it can weigh at all (ALiBi's steep heads: a few hundred), split for the threads.

Forward runs CPU's flash kernel per block (``_scaled_dot_product_flash_attention_for_cpu``: output and log-sum-exp,
honouring the mask's strides); without it, or with attention dropout, plain ops. Dropout: each block's keep mask
drawn from its own generator, seeded from torch's RNG once per call, and drawn again in backward (nothing kept).
Where a decoder's far distances all read one parameter (T5's last bucket: ``far_distance`` on the provider), causal,
contiguous and unpadded, backward takes the far keys through torch's causal kernel and the band of keys within
``far`` of each query by hand, which also gives the table its gradient (``posswap_far_split``); with a cache
(queries fewer than keys) torch's flash kernel for q, k and v and the table's gradient from that band. Float32
only: other dtypes keep the dense path.
It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import posswap_blocked, posswap_far_split, posswap_windows
from .posswap_far_split import applies as far_split_applies  # this form: transformers copies the module with it

_FLASH, _FLASH_BACKWARD = posswap_blocked.CPU_FLASH, posswap_blocked.CPU_FLASH_BACKWARD


@dataclass(frozen=True)
class Plan:
    """How one call's blocks find their bias: column ``q_pos - k_pos - lo`` of the table. ``q_pos`` (b|1, q): the
    queries' positions less ``lo``; ``k_pos`` (b|1, k): the keys' in reverse order; both None for contiguous
    positions shared by the batch (the strided-view route). ``mask``: boolean (b|1, 1, q|1, k) or None; ``causal``:
    the module's, honoured by index when no mask is given (the mask carries it otherwise); ``dropout``: its p."""

    lo: int
    q_pos: torch.Tensor | None
    k_pos: torch.Tensor | None
    mask: torch.Tensor | None
    causal: bool
    scaling: float
    dropout: float = 0.0
    far: int | None = None  # the provider's far_distance: causal distances from it on read one parameter


def trainable(module, query: torch.Tensor, key: torch.Tensor, attention_mask, dropout: float) -> bool:
    """True where the blocked training path replaces the dense bias: CPU, float32, a gradient needed or attention
    dropout, a shift-invariant bias, a boolean mask (or none), and a dense bias over ``posswap_blocked.BLOCK_BYTES``.
    Dropout alone is enough: reentrant checkpointing runs a layer's forward without gradients, then again with, and
    both runs must draw the same masks (the same route)."""
    provider = module.posswap_bias
    if query.device.type != "cpu" or query.dtype != torch.float32:
        return False
    if not (provider.has_bias and provider.shift_invariant):
        return False
    inputs = any(t.requires_grad for t in (query, key)) or any(p.requires_grad for p in provider.parameters())
    if not (torch.is_grad_enabled() and inputs) and dropout <= 0:
        return False  # inference: posswap_blocked's routes
    if attention_mask is not None and not _plain_mask(attention_mask, query.shape[2], key.shape[2]):
        return False
    batch = attention_mask.shape[0] if isinstance(attention_mask, torch.Tensor) else 1
    return batch * query.shape[1] * query.shape[2] * key.shape[2] * 4 > posswap_blocked.BLOCK_BYTES


def _plain_mask(mask, q_len: int, k_len: int) -> bool:
    return (
        isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[1] == 1
        and mask.shape[2] in (1, q_len)
        and mask.shape[3] == k_len
    )


def make_plan(provider, positions, mask, causal: bool, scaling: float, dtype, dropout: float = 0.0):
    """The distance table (heads, W) in ``dtype`` (made by the provider, so it carries the gradient back to its
    parameters) and the plan of a call with these (q_pos, k_pos) positions."""
    q_pos, k_pos = positions
    lo = int(q_pos.min() - k_pos.max())
    hi = int(q_pos.max() - k_pos.min())
    distances = torch.arange(lo, hi + 1, device=q_pos.device)
    table = provider.bias(distances[None], torch.zeros(1, 1, dtype=distances.dtype, device=q_pos.device))
    table = table[0, :, :, 0].to(dtype).contiguous()
    queries_last = torch.equal(q_pos, k_pos[:, k_pos.shape[-1] - q_pos.shape[-1] :])  # the queries: the last keys
    if posswap_blocked.contiguous_positions(k_pos) and queries_last:
        far = getattr(provider, "far_distance", None)
        return table, Plan(lo, None, None, mask, causal, scaling, dropout, far)
    return table, Plan(lo, q_pos - lo, k_pos.flip(-1), mask, causal, scaling, dropout)


def _block_keys(plan: Plan, stop: int, q_len: int, k_len: int) -> int:
    """Keys a block of queries ending at ``stop`` reads: a decoder's none after its last query (a given mask
    would leave a padded row with no key at all, whose output the dense path spreads over every key: all read)."""
    return k_len - q_len + stop if plan.causal and plan.mask is None else k_len


def _block_mask(plan: Plan, rows: tuple[int, int], keys: int, q_len: int, device) -> torch.Tensor | None:
    """Boolean (b|1, 1, rows, keys) over the first ``keys`` keys in reverse order, or None (nothing masked)."""
    start, stop = rows
    if plan.mask is not None:
        mask = plan.mask if plan.mask.shape[2] == 1 else plan.mask[:, :, start:stop]
        return mask[..., :keys].flip(-1)
    if plan.causal and plan.q_pos is not None:  # by index: positions that jump say nothing of the order
        # keys end at the block's last query: row r reads keys up to keys - rows + r
        causal = torch.ones(stop - start, keys, dtype=torch.bool, device=device).tril(keys - (stop - start))
        return causal.flip(-1)[None, None]
    return None  # contiguous positions: the causal cut and the table's lowest at negative distances do it


def _block_index(plan: Plan, rows: tuple[int, int], keys: int, q_len: int, k_len: int) -> torch.Tensor:
    """(b|1, rows, keys) table columns of a block, keys reversed (the first ``keys`` keys)."""
    start, stop = rows
    if plan.q_pos is None:  # q_pos - k_pos - lo with contiguous positions: row + reversed key + offset
        offset = k_len - q_len + start - keys + 1 - plan.lo
        r = torch.arange(stop - start)[:, None]
        return (r + torch.arange(keys)[None] + offset)[None]
    return plan.q_pos[:, start:stop, None] - plan.k_pos[:, None, k_len - keys :]


def _block_bias(table, plan: Plan, rows: tuple[int, int], keys: int, q_len: int, k_len: int, mask) -> torch.Tensor:
    """The (b|1, heads, rows, keys) bias of a block with its mask folded in (lowest where masked)."""
    start, stop = rows
    heads, width = table.shape
    if plan.q_pos is None:  # a strided view: column r + jj + offset, no copy
        offset = k_len - q_len + start - keys + 1 - plan.lo
        bias = table.as_strided((1, heads, stop - start, keys), (0, width, 1, 1), table.storage_offset() + offset)
    else:
        bias = table[:, _block_index(plan, rows, keys, q_len, k_len)].movedim(0, 1)
    return bias if mask is None else bias.masked_fill(~mask, torch.finfo(table.dtype).min)


def _blocks(q_len: int, rows: int):
    return [(start, min(q_len, start + rows)) for start in range(0, q_len, rows)]


def _rows(batch: int, heads: int, keys: int) -> int:
    """Query rows per block whose scores (batch x heads x rows x keys, fp32) fit ``BLOCK_BYTES``."""
    return max(posswap_blocked.MIN_ROWS, posswap_blocked.BLOCK_BYTES // (4 * batch * heads * keys))


def _forward_block(query, key, value, bias, scaling: float, drop) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and log-sum-exp (fp32) of one block; ``drop``: its dropout's keep mask / (1 - p), or None."""
    if _FLASH is not None and drop is None:
        return _FLASH(query, key, value, attn_mask=bias, scale=scaling)
    scores = torch.matmul(query * scaling, key.transpose(-1, -2)).add_(bias)
    lse = torch.logsumexp(scores, -1)
    probs = torch.softmax(scores, -1)  # softmax: a row with every key masked stays even
    return torch.matmul(probs if drop is None else probs.mul_(drop), value), lse


def dropout_scale(plan: Plan, shape: tuple[int, ...], seed: int, start: int) -> torch.Tensor | None:
    """The block's dropout (keep mask / (1 - p), ``shape``), drawn from a generator of its own (the call's seed and
    the block's first row): the same in forward and backward. None without dropout."""
    if plan.dropout <= 0:
        return None
    generator = torch.Generator().manual_seed(seed + start)
    return torch.empty(shape).bernoulli_(1 - plan.dropout, generator=generator).div_(1 - plan.dropout)


def _backward_block(query, key, value, grad, lse, delta, bias, scaling, grads, drop) -> torch.Tensor:
    """Adds one block's gradients to ``grads`` = (dq rows, dk, dv) and returns its scores' gradient. ``key`` and
    ``value`` carry a last column of ones, so that s - lse and dP - delta come out of the matmuls themselves."""
    scaled = query * scaling
    probs = torch.matmul(torch.cat([scaled, -lse[..., None]], -1), key.transpose(-1, -2)).add_(bias).exp_()
    dead = lse <= torch.finfo(lse.dtype).min / 2  # every key masked: lowest + log(keys) rounds to lowest,
    if dead.any():  # so exp(s - lse) reads 1 where the forward's softmax spread 1 / keys
        probs.masked_fill_(dead[..., None], 1.0 / key.shape[2])
    grads[2].add_(torch.matmul((probs if drop is None else probs * drop).transpose(-1, -2), grad))
    if drop is None:
        d_scores = torch.matmul(torch.cat([grad, -delta], -1), value.transpose(-1, -2))
    else:
        d_scores = torch.matmul(grad, value[..., :-1].transpose(-1, -2)).mul_(drop).sub_(delta)
    d_scores = d_scores.mul_(probs)
    grads[0].copy_(torch.matmul(d_scores, key[..., :-1]).mul_(scaling))
    grads[1].add_(torch.matmul(d_scores.transpose(-1, -2), scaled))
    return d_scores


def _table_grad(d_table, d_scores, mask, plan: Plan, rows, keys: int, q_len: int, k_len: int) -> None:
    """The block's score gradients summed per table column (where the mask kept the bias: the dense path's
    ``masked_fill`` gives the bias no gradient where it masks, even on a padded row with every key masked)."""
    if mask is not None:
        d_scores = d_scores.masked_fill(~mask, 0.0)
    index = _block_index(plan, rows, keys, q_len, k_len)
    if index.shape[0] == 1 and d_scores.shape[0] > 1:  # one index for the batch: its sum
        d_scores = d_scores.sum(0, keepdim=True)
    heads = d_table.shape[0]
    flat = d_scores.transpose(0, 1).reshape(heads, -1)
    d_table.index_add_(1, index.expand(d_scores.shape[0], -1, -1).reshape(-1), flat)


def _each_block(plan: Plan, table, shape: tuple[int, ...], k_len: int, rows: int):
    """Per block of ``rows`` queries: (query slice, key slice of the reversed keys, its mask or None, its bias)."""
    q_len = shape[2]
    for block in _blocks(q_len, rows):
        keys = _block_keys(plan, block[1], q_len, k_len)
        mask = _block_mask(plan, block, keys, q_len, table.device)
        bias = _block_bias(table, plan, block, keys, q_len, k_len, mask)
        yield slice(*block), slice(k_len - keys, k_len), mask, bias, block


def _forward_rows(plan: Plan, shape: tuple[int, ...], k_len: int) -> int:
    if plan.q_pos is None and plan.mask is None and plan.dropout <= 0:  # the bias a view: rows cost no memory
        return posswap_windows.FAST_ROWS
    return _rows(shape[0], shape[1], k_len)


class BlockedBiasAttention(torch.autograd.Function):
    """``softmax(q k^T * scaling + bias + mask) v`` (batch, heads, q, head_dim), the bias gathered per block from
    ``table`` as ``plan`` says; gradients to q, k, v and the table."""

    @staticmethod
    def forward(ctx, query, key, value, table, plan: Plan, seed: int = 0):
        k_len = key.shape[2]
        masked, calls = _causal_table(table.detach(), plan), None
        ctx.far_split = far_split_applies(plan, query, key)  # T5's decoder: backward by far keys and band
        if plan.q_pos is None and plan.mask is None and plan.lo <= 0:  # queries last, unpadded: own key read
            masked, windows = posswap_windows.reach(masked, -plan.lo, query, key, plan.scaling)
            if _FLASH is not None and plan.dropout <= 0:  # each group of heads over the keys it weighs
                calls = posswap_windows.plan_calls(windows, query.shape[2], k_len, plan.causal, query.shape[0])
        k_rev, v_rev = key.flip(2), value.flip(2)
        out = query.new_empty(*query.shape[:3], value.shape[-1])
        lse = query.new_empty(query.shape[:3], dtype=torch.float32)
        if calls is not None:
            for call in calls:
                q, k, v, bias = _call_inputs(call, query, (k_rev, v_rev), masked, plan)
                block_out, block_lse = _FLASH(q, k, v, attn_mask=bias, scale=plan.scaling)
                posswap_windows.rows_of(out, call).copy_(block_out)
                posswap_windows.rows_of(lse, call).copy_(block_lse)
        else:
            rows = _forward_rows(plan, query.shape, k_len)
            for sl, ks, _, bias, _ in _each_block(plan, masked, query.shape, k_len, rows):
                drop = dropout_scale(plan, (*query.shape[:2], sl.stop - sl.start, ks.stop - ks.start), seed, sl.start)
                out[:, :, sl], lse[:, :, sl] = _forward_block(
                    query[:, :, sl], k_rev[:, :, ks], v_rev[:, :, ks], bias, plan.scaling, drop
                )
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.plan, ctx.masked, ctx.seed, ctx.calls = plan, masked, seed, calls
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse = ctx.saved_tensors
        plan, masked, k_len = ctx.plan, ctx.masked, key.shape[2]
        if ctx.far_split:
            d_table = torch.zeros_like(masked) if ctx.needs_input_grad[3] else None
            grads = posswap_far_split.backward(ctx.saved_tensors, grad_out.contiguous(), masked, plan, d_table)
            return *grads, d_table, None, None
        k_rev, v_rev, grad_out = key.flip(2), value.flip(2), grad_out.contiguous()
        grads = torch.empty_like(query), torch.zeros_like(k_rev), torch.zeros_like(v_rev)
        d_table = torch.zeros_like(masked) if ctx.needs_input_grad[3] else None
        dead = bool((lse <= torch.finfo(lse.dtype).min / 2).any())
        flash = _FLASH_BACKWARD is not None and not dead and plan.dropout <= 0
        if flash and (d_table is None or _band_route(plan)):  # torch's kernel for q, k, v: no score gradient kept
            _flash_backward(plan, masked, ctx.calls, (query, k_rev, v_rev, out, lse), grad_out, grads)
            if d_table is not None:  # the table's gradient from the keys near each query only
                posswap_far_split.band_gradients(d_table, plan, masked, (query, key, value, out, lse), grad_out)
            return grads[0], grads[1].flip(2), grads[2].flip(2), d_table, None, None
        delta = (grad_out * out).sum(-1, keepdim=True)  # rowsum(dO * O) = rowsum(P * dP)
        ones = k_rev.new_ones(*k_rev.shape[:3], 1)
        k_rev, v_rev = torch.cat([k_rev, ones], -1), torch.cat([v_rev, ones], -1)
        for sl, ks, mask, bias, block in _each_block(plan, masked, query.shape, k_len, _rows(*query.shape[:2], k_len)):
            drop = dropout_scale(plan, (*query.shape[:2], sl.stop - sl.start, ks.stop - ks.start), ctx.seed, sl.start)
            d_scores = _backward_block(
                query[:, :, sl], k_rev[:, :, ks], v_rev[:, :, ks], grad_out[:, :, sl], lse[:, :, sl],
                delta[:, :, sl], bias, plan.scaling, (grads[0][:, :, sl], grads[1][:, :, ks], grads[2][:, :, ks]), drop,
            )  # fmt: skip
            if d_table is not None:
                _table_grad(d_table, d_scores, mask, plan, block, ks.stop - ks.start, query.shape[2], k_len)
        if d_table is not None and plan.q_pos is None and plan.causal and plan.mask is None:
            d_table[:, : -plan.lo] = 0.0  # negative distances: masked (the causal cut), no gradient
        return grads[0], grads[1].flip(2), grads[2].flip(2), d_table, None, None


def _flash_backward(plan: Plan, table, calls, saved: tuple, grad_out, grads: tuple) -> None:
    """q, k, v gradients block by block through torch's CPU flash backward (no gradient to the table wanted, and
    no row with every key masked: the kernel's exp(s - lse) reads 1 on those, where the softmax gave 1 / keys);
    with ``calls``, the forward's (``posswap_windows.plan_calls``)."""
    query, k_rev, v_rev, out, lse = saved
    k_len = k_rev.shape[2]
    if calls is None:
        for sl, ks, _, bias, _ in _each_block(plan, table, query.shape, k_len, _forward_rows(plan, query.shape, k_len)):
            blocks = (query[:, :, sl], k_rev[:, :, ks], v_rev[:, :, ks], out[:, :, sl], lse[:, :, sl])
            d_q, d_k, d_v = _FLASH_BACKWARD(grad_out[:, :, sl], *blocks, 0.0, False, attn_mask=bias, scale=plan.scaling)
            grads[0][:, :, sl] = d_q
            grads[1][:, :, ks] += d_k
            grads[2][:, :, ks] += d_v
        return
    rows = posswap_windows.rows_of
    for call in calls:
        q, k, v, bias = _call_inputs(call, query, (k_rev, v_rev), table, plan)
        d_q, d_k, d_v = _FLASH_BACKWARD(
            rows(grad_out, call), q, k, v, rows(out, call), rows(lse, call), 0.0, False, attn_mask=bias,
            scale=plan.scaling,
        )  # fmt: skip
        rows(grads[0], call).copy_(d_q)
        posswap_windows.add_keys(grads[1], call, d_k)
        posswap_windows.add_keys(grads[2], call, d_v)


def _call_inputs(call, query, reversed_: tuple, table, plan: Plan) -> tuple:
    """Query, keys and values (in reverse order) and bias of one ``posswap_windows.Call``."""
    past = reversed_[0].shape[2] - query.shape[2]
    return (
        posswap_windows.rows_of(query, call),
        posswap_windows.keys_of(reversed_[0], call),
        posswap_windows.keys_of(reversed_[1], call),
        posswap_windows.bias_of(table, -plan.lo, call, past),
    )


def _band_route(plan: Plan) -> bool:
    """Causal, contiguous positions, no mask, and a provider whose far distances share a parameter (``make_plan``
    sets ``far`` for contiguous positions only)."""
    return plan.far is not None and plan.causal and plan.mask is None


def _causal_table(table: torch.Tensor, plan: Plan) -> torch.Tensor:
    """The table with lowest at negative distances where they mark later keys (contiguous positions, causal,
    no mask): a block's strided view then masks what its causal cut keeps of them."""
    if plan.q_pos is not None or not plan.causal or plan.mask is not None or plan.lo >= 0:
        return table
    masked = table.clone()
    masked[:, : -plan.lo] = torch.finfo(table.dtype).min
    return masked
