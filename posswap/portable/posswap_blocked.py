"""Inference attention for the bias methods (ALiBi, T5 bias, TUPE-R) on CPU that never builds the whole
(heads, q, k) bias.

The dense path (``posswap_attention.additive_mask``) builds one fp32 (b|1, heads, q, k) bias+mask per forward: at
4k tokens hundreds of MiB, written once and read by every layer's SDPA. Where no gradient is needed and the
tensors are on the CPU, ``posswap_attention.blocked_attention`` replaces it, with the two routes here:

- *Shift-invariant bias, positions 0..n-1 (+ a constant), no padding or right padding* (the common case: a
  document, a batch of equal or right-padded documents, a prompt): the bias depends on ``i - j`` only, so
  every row is a slice of one (heads, q + k - 1) vector ``V[t]``. With the keys taken in reverse order the
  (rows, keys) bias is the Hankel matrix ``V[r + jj + c]``: an ``as_strided`` view of that vector (strides 1,
  1), which CPU's flash kernel reads through its mask strides. No (q, k) tensor exists at all. Without padding,
  queries in blocks, each group of heads over the keys it can weigh (``posswap_windows.py``: a decoder's none
  after the block's last query, ``V[t < 0]`` = lowest; ALiBi's steep heads a few hundred). Right padding: one
  call per sequence, over its real keys.
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

from .posswap_windows import Call, bias_of, keys_of, plan_calls, reach, rows_of

try:  # torch's own CPU flash kernels, as F.scaled_dot_product_attention runs them, with the log-sum-exp it discards:
    # what the training paths (posswap_blocked_grad.py, posswap_far_split.py) call
    CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    CPU_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
except (AttributeError, RuntimeError):  # a torch without them: plain ops
    CPU_FLASH = CPU_FLASH_BACKWARD = None

# The most bytes of bias one block of the general path may hold (fp32, b|1 x heads x rows x keys).
BLOCK_BYTES = 8 * 2**20
MIN_ROWS = 32


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


def hankel(vector: torch.Tensor, past: int, q_len: int, rows: tuple[int, int], keys: int) -> torch.Tensor:
    """(1, heads, rows, keys) view of ``vector``: the bias of queries ``rows`` (indices among the q) against
    the first ``keys`` keys taken in reverse order (key jj is key ``keys - 1 - jj``)."""
    call = Call(slice(0, vector.shape[0]), rows[0], rows[1] - rows[0], 0, keys)
    return bias_of(vector, q_len - 1, call, past)


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
    out = query.new_empty(*query.shape[:3], value.shape[-1])
    if lengths is not None:  # right padding: each sequence over its own real keys
        for b, length in enumerate(lengths):
            k_rev, v_rev = key[b : b + 1, :, :length].flip(2), value[b : b + 1, :, :length].flip(2)
            mask = hankel(vector, past, q_len, (0, q_len), length)
            out[b : b + 1] = F.scaled_dot_product_attention(
                query[b : b + 1], k_rev, v_rev, attn_mask=mask, scale=scaling
            )
        return out
    # every query reads its own key (distance 0, column q - 1): each group of heads reads the keys it weighs
    vector, windows = reach(vector, q_len - 1, query, key, scaling)
    k_rev, v_rev = key.flip(2), value.flip(2)
    for call in plan_calls(windows, q_len, k_len, causal, query.shape[0]):
        rows_of(out, call).copy_(
            F.scaled_dot_product_attention(
                rows_of(query, call),
                keys_of(k_rev, call),
                keys_of(v_rev, call),
                attn_mask=bias_of(vector, q_len - 1, call, past),
                scale=scaling,
            )
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
