"""Pure tensor math for position schemes, shared by patch-time and run-time code (as timm's pos_embed)."""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

RESAMPLE_MODES = ("copy", "linear", "cubic", "stride", "hierarchical")
HIERARCHICAL_ALPHA = 0.4  # Su (2020)'s weight of the block row: the local row keeps 0.6 of its length


def resample_table(table: torch.Tensor, rows: int, mode: str) -> torch.Tensor:
    """Return a position table of ``rows`` rows made from ``table`` (rows x dim).

    - ``copy``: the old rows tiled until ``rows`` (Longformer's initialisation). Every position below the
      old length keeps its exact old vector; shrinking keeps the first ``rows`` rows.
    - ``linear`` / ``cubic``: the table resampled along positions (position interpolation). Corners are
      aligned so position 0 keeps its exact vector and new position p reads old position
      p * (old - 1) / (rows - 1), close to Chen et al.'s p * old / rows.
    - ``stride``: LongEmbed's E5-Base-4k placement (:func:`stride_table`): old row i exactly at position k * i,
      k = rows // old, the rows between filled by linear interpolation.
    - ``hierarchical``: Su's hierarchical decomposition (:func:`hierarchical_table`): position p reads old row
      p % old plus a vector for its block p // old, so neighbours keep their exact old distances at every length.
    Same length is the identity for every mode. Math in fp32, result in the table's dtype.
    """
    if mode not in RESAMPLE_MODES:
        raise ValueError(f"mode must be one of {', '.join(RESAMPLE_MODES)}; got {mode!r}.")
    old = table.shape[0]
    if rows == old:
        return table.clone()
    if mode == "copy":
        return table.repeat(math.ceil(rows / old), 1)[:rows].clone()
    if mode == "stride":
        return stride_table(table, rows)
    if mode == "hierarchical":
        return hierarchical_table(table, rows)
    if old == 1:
        return table.expand(rows, -1).clone()
    # (rows, dim) -> (1, dim, rows, 1): a one-pixel-wide image, so "bicubic" is cubic along positions.
    image = table.detach().float().t()[None, :, :, None]
    mode_2d = "bilinear" if mode == "linear" else "bicubic"
    resized = F.interpolate(image, size=(rows, 1), mode=mode_2d, align_corners=True)
    return resized[0, :, :, 0].t().to(table.dtype).contiguous()


def hierarchical_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """Su Jianlin's hierarchical decomposition of a learned table (2020, "BERT for longer texts"), anchored at row
    1: with ``u_i = (e_{i+1} - alpha e_1) / (1 - alpha)``, position ``p = q * n + r`` (n old rows) reads
    ``e_r + alpha / (1 - alpha) (e_{1+q} - e_1)``: its old row within the block (so every position below n keeps its
    exact vector, and two tokens of one block their exact old offsets) plus a coarse block vector. Su anchors at row
    0; a BERT's row 0 is its [CLS]'s, far from the rest, and would add most of itself to every token past n.
    Shrinking keeps the first ``rows`` rows; ``rows`` up to n (n - 1)."""
    old = table.shape[0]
    if rows <= old:
        return table[:rows].clone()
    if rows > old * (old - 1):
        raise ValueError(f"hierarchical placement reaches {old * (old - 1)} positions from {old} rows; got {rows}.")
    return blocks_with_vectors(table, table, rows)


def blocked_stride_table(table: torch.Tensor, rows: int, blocks: int) -> torch.Tensor:
    """``blocks`` stride tables of ``rows // blocks`` rows end to end, each block after the first plus the block
    vector of :func:`hierarchical_table`: position ``p = q * B + r`` reads row r of the B-row stride table, so
    neighbours stand ``old / B`` old positions apart (not ``old / rows``) and the blocks differ by a coarse vector.
    One block is :func:`stride_table`."""
    length = rows // blocks
    if blocks < 1 or length * blocks != rows or blocks >= table.shape[0]:
        raise ValueError(f"stride_blocks must divide {rows} into blocks, fewer than {table.shape[0]}; got {blocks}.")
    return blocks_with_vectors(stride_table(table, length), table, rows)


def blocks_with_vectors(block: torch.Tensor, table: torch.Tensor, rows: int) -> torch.Tensor:
    """``rows`` positions laid out as copies of ``block`` end to end, copy q plus the old ``table``'s block vector
    ``alpha / (1 - alpha) (e_{1+q} - e_1)`` (zero for the first). Math in fp32 at least (fp64 kept), result in the
    table's dtype."""
    dtype = torch.promote_types(table.dtype, torch.float32)
    placed, block = table.detach().to(dtype), block.detach().to(dtype)
    positions = torch.arange(rows)
    length = block.shape[0]
    vectors = (placed[1 + positions // length] - placed[1]) * (HIERARCHICAL_ALPHA / (1 - HIERARCHICAL_ALPHA))
    return (block[positions % length] + vectors).to(table.dtype).contiguous()


def stride_table(table: torch.Tensor, rows: int) -> torch.Tensor:
    """LongEmbed's E5-Base-4k initialisation (Zhu et al. 2024): old row i becomes row k * i, k = rows // old, so
    that position ids multiplied by k read the original table exactly. LongEmbed trains the rows between; here they
    start on the straight line between their placed neighbours (row k*i + j = old_i + (old_{i+1} - old_i) * j / k)
    and the rows past the last placed one (k*(old-1) + 1 ...) repeat it. Shrinking keeps the first ``rows`` rows."""
    old = table.shape[0]
    k = rows // old
    if k <= 1:  # same length, shrinking, or too few rows for a stride of 2: the old rows stay where they are
        return torch.cat([table[:rows], table[-1:].expand(max(rows - old, 0), -1)]).clone()
    placed = table.detach().float()
    fractions = torch.arange(k, dtype=torch.float32)[:, None, None] / k  # (k, 1, 1): j / k
    between = placed[:-1] + (placed[1:] - placed[:-1]) * fractions  # (k, old - 1, dim): row k*i + j at [j, i]
    body = between.transpose(0, 1).reshape(k * (old - 1), -1)
    tail = placed[-1:].expand(rows - body.shape[0], -1)
    return torch.cat([body, tail]).to(table.dtype).contiguous()


def resample_positions(weight: torch.Tensor, offset: int, rows: int, mode: str, blocks: int = 1) -> torch.Tensor:
    """A position table's weight for ``rows`` real positions: the ``offset`` rows before the first real position
    (RoBERTa's padding rows) kept as they are, the rest resampled with :func:`resample_table` (``blocks`` > 1:
    :func:`blocked_stride_table`)."""
    head, body = weight[:offset], weight[offset:]
    if blocks > 1 and mode != "stride":
        raise ValueError(f"stride blocks are stride tables; got mode {mode!r}.")
    if blocks > 1:
        return torch.cat([head, blocked_stride_table(body, rows, blocks)])
    return torch.cat([head, resample_table(body, rows, mode)])


def sinusoidal_table(rows: int, dim: int, theta: float = 10000.0) -> torch.Tensor:
    """The fixed position table of the original Transformer (Vaswani et al.), (rows, dim), float32:
    ``sin(p * theta^(-2i/dim))`` on even dims 2i, ``cos`` of the same angle on odd dims 2i + 1. Angles are made in
    float64 on the CPU: in float32, ``p * frequency`` is off by ~0.01 rad past p = 100k."""
    positions = torch.arange(rows, dtype=torch.float64)[:, None]
    frequencies = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions * frequencies  # (rows, ceil(dim / 2))
    table = torch.empty(rows, dim, dtype=torch.float64)
    table[:, 0::2] = angles.sin()
    table[:, 1::2] = angles[:, : dim // 2].cos()  # an odd dim ends on a sin column
    return table.float()


def rope_frequencies(
    head_dim: int,
    rotary_dim: int,
    theta: float,
    rope_type: str | None,
    factor: float,
    original_length: int,
    seq_len: int | None = None,
    extra: dict | None = None,
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (rotary_dim / 2,) and the cos/sin scale, from transformers' ``ROPE_INIT_FUNCTIONS``.

    Plain RoPE is ``linear`` with factor 1. ``original_length`` is what the model was trained at: yarn's
    ``original_max_position_embeddings`` and the length past which ``dynamic`` starts to stretch.
    """
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = rope_type or "linear"  # plain RoPE: linear with factor 1
    parameters = {"rope_type": kind, "rope_theta": float(theta), "factor": float(factor if rope_type else 1.0)}
    parameters["partial_rotary_factor"] = rotary_dim / head_dim
    if kind == "yarn":
        parameters["original_max_position_embeddings"] = original_length
    parameters.update(extra or {})
    # A Llama config is the carrier transformers' rope functions read their parameters from.
    config = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        max_position_embeddings=original_length,
        rope_parameters=parameters,
    )
    return ROPE_INIT_FUNCTIONS[kind](config, device=None, seq_len=seq_len)


def no_autocast(device_type: str):
    """Autocast off on ``device_type``; nothing to turn off where there is no autocast (the meta device: shapes only)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type=device_type, enabled=False)
    return contextlib.nullcontext()


def rotary_cos_sin(
    inv_freq: torch.Tensor, position_ids: torch.Tensor, scale: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (batch, length, rotary_dim), fp32 whatever autocast says: positions times frequencies
    lose precision in half precision long before 4k."""
    with no_autocast(position_ids.device.type):
        angles = position_ids[..., None].float() * inv_freq.float().to(position_ids.device)
        angles = torch.cat((angles, angles), dim=-1)  # the rotate_half layout of transformers' Llama
        cos, sin = angles.cos(), angles.sin()
        return (cos, sin) if scale == 1.0 else (cos * scale, sin * scale)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of every head of x (batch, length, heads, head_dim); the
    rest pass through. Computed in fp32, returned in x's dtype."""
    from transformers.models.llama.modeling_llama import rotate_half

    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, :, None], sin[:, :, None]
    with no_autocast(x.device.type):
        rotated, passed = x[..., :rotary_dim].float(), x[..., rotary_dim:]
        rotated = rotated * cos + rotate_half(rotated) * sin
        return torch.cat((rotated.to(x.dtype), passed), dim=-1) if passed.shape[-1] else rotated.to(x.dtype)


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """``sin`` with rotate_half's sign folded in: rotate_half(x) * sin == swap_halves(x) * signed_sin(sin)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def rotate_in_place(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """:func:`apply_rotary` written into ``x`` (batch, length, ..., head_dim), e.g. a view of a q/k projection's
    output: a third of the temporaries and no concatenation of the untouched dims (measured on CPU: 2.5x faster
    than apply_rotary and a torch.cat per projection). ``cos``, ``sin_signed`` (batch, length, rotary_dim), the
    latter from :func:`signed_sin`. Computed in fp32, written in x's dtype; autograd sees an in-place copy."""
    rotary_dim = cos.shape[-1]
    half = rotary_dim // 2
    broadcast = (*cos.shape[:2], *[1] * (x.dim() - 3), rotary_dim)
    cos, sin_signed = cos.view(broadcast), sin_signed.view(broadcast)
    with no_autocast(x.device.type):
        part = x[..., :rotary_dim]
        swapped = torch.cat((part[..., half:], part[..., :half]), dim=-1).float()
        part.copy_(torch.addcmul(part.float() * cos, swapped, sin_signed))
    return x


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes (Press et al., "Train Short, Test Long"), float32, shape (num_heads,).

    For a power of two n: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^(-8). Otherwise the slopes of
    the closest lower power of two, followed by every other slope of twice that power: the rule of the
    reference code (ofirpress/attention_with_linear_biases, ``get_slopes``).
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}.")

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))  # = 2^(-8/n)
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        slopes = power_of_two(num_heads)
    else:
        lower = 2 ** math.floor(math.log2(num_heads))
        slopes = power_of_two(lower) + power_of_two(2 * lower)[0::2][: num_heads - lower]
    return torch.tensor(slopes, dtype=torch.float32)


def alibi_bias(
    slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, symmetric: bool
) -> torch.Tensor:
    """The additive ALiBi bias, shape (..., heads, q, k), in ``slopes``' dtype.

    ``q_positions`` (..., q) and ``k_positions`` (..., k) are integer positions (leading dims broadcast).
    symmetric: ``-m_h * |i - j|`` (encoders); else ``-m_h * (i - j)`` (decoders: only the keys a causal
    mask lets through, j <= i, are meaningful; later keys get a positive bias that the mask removes).
    """
    distance = q_positions[..., :, None] - k_positions[..., None, :]
    return alibi_term(slopes[:, None, None], distance.unsqueeze(-3).to(slopes.dtype), symmetric)


def alibi_term(slope, distance, symmetric: bool):
    """ALiBi's formula, once for the dense bias and flex attention's score_mod: ``-m * |d|`` or ``-m * d``."""
    return -slope * (distance.abs() if symmetric else distance)


def cosine_matrix(vectors: torch.Tensor) -> torch.Tensor:
    """(n, n) cosine similarity of the rows of ``vectors`` (n, d), in float32."""
    unit = F.normalize(vectors.float(), dim=-1)
    return unit @ unit.t()


def hide_future(matrix: torch.Tensor, positions: torch.Tensor, causal: bool) -> torch.Tensor:
    """NaN where a decoder's causal mask hides the key (j > i): a logit term there never reaches attention."""
    if causal:
        matrix = matrix.masked_fill(positions[None, :] > positions[:, None], float("nan"))
    return matrix
