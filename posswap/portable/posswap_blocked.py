"""Inference attention for the bias methods (ALiBi, T5 bias, TUPE-R) on CPU that never builds the whole
(heads, q, k) bias.

The dense path (``posswap_attention.additive_mask``) builds one fp32 (b|1, heads, q, k) bias+mask per forward: at
4k tokens hundreds of MiB, written once and read by every layer's SDPA. Where no gradient is needed and the
tensors are on the CPU, ``posswap_attention.blocked_attention`` replaces it, with the two routes here:

- *Shift-invariant bias, positions 0..n-1 (+ a constant), no padding or right padding* (the common case: a
  document, a batch of equal or right-padded documents, a prompt): the bias depends on ``i - j`` only, so
  every row is a slice of one (heads, q + k - 1) vector ``V[t]``. With the keys taken in reverse order the
  (rows, keys) bias is the Hankel matrix ``V[r + jj + c]``: an ``as_strided`` view of that vector (strides 1,
  1), which CPU's flash kernel reads through its mask strides. No (q, k) tensor exists at all. Encoders: one
  SDPA call over all queries. Decoders: queries in blocks of ``FAST_ROWS``, each with only the keys up to its
  last query (the causal cut, ``V[t < 0]`` = lowest). Right padding: one call per sequence, over its real keys.
- *Anything else* (left padding, jumping or per-row position ids, packed masks, other providers): queries in
  blocks, each block's (b|1, heads, rows, k) bias built from positions with its mask slice, rows chosen so
  that one block holds at most ``BLOCK_BYTES``.

Both give the dense path's output up to fp32 rounding (the kernel sums keys in another order). Training has its
own blocked path (``posswap_blocked_grad.py``: the scores recomputed in backward). On a GPU the dense path stays too: CUDA's memory-efficient SDPA reads a
float mask at memory bandwidth, and ``backend="flex"`` (score_mod compiled to one Triton kernel, the bias made
in registers) is what a GPU wants for long inputs; the loop of SDPA calls here suits CPU's flash kernel, whose
cost is per score and which honours mask strides.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The most bytes of bias one block of the general path may hold (fp32, b|1 x heads x rows x keys).
BLOCK_BYTES = 8 * 2**20
MIN_ROWS = 32
# Query rows per SDPA call on the fast causal path. Each block computes half a block of masked scores (stock's
# is_causal skips them), so smaller is less work; but every call is a parallel region, and CPU's flash kernel tiles
# 64 query rows below 768 queries (256 from 768 on). Measured at 2k and 4k tokens (reference GPT-2, one thread):
# 256-512 rows cost 1.07-1.14x stock's attention, 768 1.12-1.28x, 1024 1.19-1.32x.
FAST_ROWS = 512
# A key whose weight is under e^-60 of the largest in its row adds nothing an fp32 sum can hold (e^-60 ~ 1e-26).
NEGLIGIBLE = 60.0


def wanted(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask, dropout: float) -> bool:
    """True where the blocked path replaces the dense one: CPU, no dropout, nothing that needs a gradient, and
    a dense bias larger than ``BLOCK_BYTES`` (below that, one bias shared by the layers is the cheaper). The dense
    bias takes the mask's batch (a padding mask makes it one per sequence)."""
    if query.device.type != "cpu" or dropout > 0:
        return False
    if torch.is_grad_enabled() and (
        query.requires_grad
        or key.requires_grad
        or value.requires_grad
        or any(p.requires_grad for p in module.posswap_bias.parameters())
    ):
        return False
    batch = attention_mask.shape[0] if isinstance(attention_mask, torch.Tensor) else 1
    return batch * query.shape[1] * query.shape[2] * key.shape[2] * 4 > BLOCK_BYTES


def contiguous_positions(k_pos: torch.Tensor) -> bool:
    """Key positions c, c+1, ..., the same in every row (the queries are the last of them)."""
    first = k_pos[:1]
    if k_pos.shape[0] > 1 and not torch.equal(k_pos, first.expand_as(k_pos)):
        return False
    start = int(first[0, 0])
    return torch.equal(first[0], torch.arange(start, start + k_pos.shape[-1], device=k_pos.device))


def distance_vector(provider, q_len: int, k_len: int, causal: bool, dtype) -> torch.Tensor:
    """(heads, q + k - 1): the bias at query-minus-key distance ``t = index - (q - 1)``, t from -(q - 1) to
    k - 1; lowest where t < 0 for a decoder (later keys)."""
    t = torch.arange(-(q_len - 1), k_len)
    vector = provider.bias(t[None], torch.zeros(1, 1, dtype=t.dtype))[0, :, :, 0].to(dtype)
    if causal:
        vector[:, : q_len - 1] = torch.finfo(dtype).min
    return vector.contiguous()


def without_negligible(vector: torch.Tensor, zero_at: int, query, key, scaling: float) -> torch.Tensor:
    """``vector`` (heads, W) of biases by distance with lowest wherever the bias alone puts a key's weight under
    e^-NEGLIGIBLE times the weight of the query's own key (distance 0, column ``zero_at``; read by every query on
    the routes that call this: contiguous positions, queries last, no padding). Such weights change no fp32 output,
    but an exponential between e^-104 and e^-87 is a denormal number, which x86 cores compute about a hundred
    times slower unless the thread flushes them (torch leaves that off, per thread): ALiBi's far keys made its
    training step at 4k tokens 2.9x the stock model's. What the keys' content can add is bounded by
    q.(k_j - k_i) <= |q| (|k_j| + |k_i|)."""
    with torch.no_grad():
        reach = 2 * scaling * float(query.norm(dim=-1).amax()) * float(key.norm(dim=-1).amax())
        negligible = vector < vector[:, zero_at : zero_at + 1] - (NEGLIGIBLE + reach)
        if not bool(negligible.any()):
            return vector
        return vector.masked_fill(negligible, torch.finfo(vector.dtype).min)


def hankel(vector: torch.Tensor, past: int, q_len: int, rows: tuple[int, int], keys: int) -> torch.Tensor:
    """(1, heads, rows, keys) view of ``vector``: the bias of queries ``rows`` (indices among the q) against
    the first ``keys`` keys taken in reverse order (key jj is key ``keys - 1 - jj``)."""
    start, stop = rows
    # t = (past + start + r) - (keys - 1 - jj); index = t + q - 1
    offset = past + start - keys + q_len
    heads, width = vector.shape
    return vector.as_strided((1, heads, stop - start, keys), (0, width, 1, 1), vector.storage_offset() + offset)


def key_prefix_lengths(mask: torch.Tensor, batch: int, k_len: int) -> list[int] | None:
    """Real keys of each of the ``batch`` sequences where the mask is right padding only (the same keys for every
    query, a prefix): their counts; None for any other mask. A mask of batch 1 serves every sequence."""
    if mask.dtype != torch.bool or mask.shape[-1] != k_len or mask.shape[1] != 1 or mask.shape[0] not in (1, batch):
        return None
    keep = mask[:, 0, -1]  # (b, k)
    if not torch.equal(mask, keep[:, None, None, :].expand_as(mask)):
        return None
    lengths = keep.sum(-1)
    prefix = torch.arange(k_len, device=mask.device)[None] < lengths[:, None]
    if not torch.equal(prefix, keep) or not bool((lengths > 0).all()):
        return None
    return lengths.tolist() * (batch // mask.shape[0])


def fast_sdpa(query, key, value, vector, causal: bool, lengths: list[int] | None, scaling: float) -> torch.Tensor:
    """Shift-invariant bias, contiguous positions: Hankel views of ``vector`` over reversed keys. ``lengths``
    (right padding, an encoder's) and ``causal`` do not come together."""
    q_len, k_len = query.shape[2], key.shape[2]
    past = k_len - q_len
    k_rev, v_rev = key.flip(2), value.flip(2)
    if lengths is None:  # every query reads its own key (distance 0, index q - 1 of the vector)
        vector = without_negligible(vector, q_len - 1, query, key, scaling)
    if lengths is None and not causal:  # one call over every query
        return F.scaled_dot_product_attention(
            query, k_rev, v_rev, attn_mask=hankel(vector, past, q_len, (0, q_len), k_len), scale=scaling
        )
    out = query.new_empty(*query.shape[:3], value.shape[-1])
    if lengths is not None:  # right padding: each sequence over its own real keys
        for b, length in enumerate(lengths):
            k_rev, v_rev = key[b : b + 1, :, :length].flip(2), value[b : b + 1, :, :length].flip(2)
            mask = hankel(vector, past, q_len, (0, q_len), length)
            out[b : b + 1] = F.scaled_dot_product_attention(
                query[b : b + 1], k_rev, v_rev, attn_mask=mask, scale=scaling
            )
        return out
    for start in range(0, q_len, FAST_ROWS):
        stop = min(q_len, start + FAST_ROWS)
        keys = past + stop  # a decoder's block sees no key after its last query
        mask = hankel(vector, past, q_len, (start, stop), keys)
        out[:, :, start:stop] = F.scaled_dot_product_attention(
            query[:, :, start:stop],
            k_rev[:, :, k_len - keys :],
            v_rev[:, :, k_len - keys :],
            attn_mask=mask,
            scale=scaling,
        )
    return out


def general_sdpa(query, key, value, attention_mask, positions, combine, causal: bool, scaling: float) -> torch.Tensor:
    """Queries in blocks; each block's bias built from its positions and merged with its mask slice by
    ``combine(q_pos, k_pos, mask_slice, first_row)`` (the dense path's own merging)."""
    q_pos, k_pos = positions
    q_len, k_len = query.shape[2], key.shape[2]
    past = k_len - q_len
    batch = max(q_pos.shape[0], 1 if attention_mask is None else attention_mask.shape[0])
    rows = max(MIN_ROWS, BLOCK_BYTES // (4 * batch * query.shape[1] * k_len))
    out = query.new_empty(*query.shape[:3], value.shape[-1])
    for start in range(0, q_len, rows):
        stop = min(q_len, start + rows)
        keys = past + stop if causal and attention_mask is None else k_len
        mask = None
        if attention_mask is not None:
            mask = attention_mask if attention_mask.shape[-2] == 1 else attention_mask[..., start:stop, :]
            mask = mask[..., :keys]
        bias = combine(q_pos[..., start:stop], k_pos[..., :keys], mask, start)
        out[:, :, start:stop] = F.scaled_dot_product_attention(
            query[:, :, start:stop], key[:, :, :keys], value[:, :, :keys], attn_mask=bias, scale=scaling
        )
    return out
