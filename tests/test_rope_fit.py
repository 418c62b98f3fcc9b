"""``RopeConfig(init="fit")``: the first layer's q/k biases, rotated, rebuild the dropped table's position-position
logits per distance. Checked against the rotation itself (posswap's apply_rotary, transformers' rotate_half) and
against the original model's own first-layer logits."""

from __future__ import annotations

import math

import pytest
import torch
import transformers

import posswap
from posswap.methods.rope_fit import bias_pairs, distance_profile, fit_cosines
from posswap.portable.posswap_functional import apply_rotary, rotary_cos_sin

HEAD_DIM, HEADS, WINDOW = 16, 4, 128


def test_fitted_biases_rotated_give_the_profile():
    """A profile made of the rotary frequencies is fitted exactly, and the biases, rotated at positions i and j
    by posswap's own rotation, give that profile at i - j."""
    frequencies = torch.tensor([1.0, 0.3, 0.1], dtype=torch.float64)
    distances = torch.arange(WINDOW)
    profile = torch.stack(
        [0.8 * torch.cos(distances * 1.0) - 0.3 * torch.sin(distances * 0.3), 0.5 * torch.sin(distances * 0.1)]
    ).double()
    c, s = fit_cosines(profile, torch.ones(WINDOW, dtype=torch.float64), distances, frequencies)
    torch.testing.assert_close(c, torch.tensor([[0.8, 0, 0], [0, 0, 0]], dtype=torch.float64), atol=2e-3, rtol=0)
    torch.testing.assert_close(s, torch.tensor([[0, -0.3, 0], [0, 0, 0.5]], dtype=torch.float64), atol=2e-3, rtol=0)
    b_q, b_k = bias_pairs(c, s, logit_scale=0.25)
    half = len(frequencies)
    as_dims = lambda pairs: torch.cat([pairs[..., 0], pairs[..., 1]], -1).float()  # noqa: E731 (rotate_half layout)
    positions = torch.arange(40)[None]
    inv_freq = frequencies.float()
    cos, sin = rotary_cos_sin(inv_freq, positions)
    q = apply_rotary(as_dims(b_q)[None, None].expand(1, 40, 2, 2 * half), cos, sin)  # (1, n, heads, dims)
    k = apply_rotary(as_dims(b_k)[None, None].expand(1, 40, 2, 2 * half), cos, sin)
    logits = torch.einsum("bihd,bjhd->hij", q, k) * 0.25
    i, j = torch.tril_indices(40, 40)
    torch.testing.assert_close(logits[:, i, j], profile[:, i - j].float(), atol=5e-3, rtol=0)


def test_distance_profile_centres_rows_and_counts_pairs():
    scores = torch.tensor([[[1.0, 9.0, 9.0], [2.0, 4.0, 9.0], [0.0, 3.0, 6.0]]], dtype=torch.float64)
    profile, counts, distances = distance_profile(scores, causal=True)
    assert distances.tolist() == [0, 1, 2] and counts.tolist() == [3, 2, 1]
    # centred rows (causal keys only): [0], [-1, 1], [-3, 0, 3]; d = 0: (0 + 1 + 3) / 3, d = 1: (-1 + 0) / 2, d = 2: -3
    torch.testing.assert_close(profile[0], torch.tensor([4 / 3, -0.5, -3.0], dtype=torch.float64))


def positional_gpt2() -> transformers.GPT2LMHeadModel:
    """A GPT-2 whose first layer sees positions only: token embeddings zero, a sinusoid table at frequencies RoPE
    has, and q = k = the table's dims in every head, so its position-position logits depend on distance."""
    config = transformers.GPT2Config(
        n_layer=1,
        n_embd=HEADS * HEAD_DIM,
        n_head=HEADS,
        vocab_size=64,
        n_positions=WINDOW,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    width = config.n_embd
    with torch.no_grad():
        model.transformer.wte.weight.zero_()
        inv_freq = 1.0 / 10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM)
        turning = inv_freq[inv_freq >= 2 * math.pi / WINDOW]  # what the fit uses: a turn inside the window
        angles = (
            torch.arange(WINDOW)[:, None] * turning.repeat(HEAD_DIM // 2 // len(turning) + 1)[None, : HEAD_DIM // 2]
        )
        rows = torch.cat([angles.sin(), angles.cos()], -1)  # (WINDOW, HEAD_DIM)
        model.transformer.wpe.weight.copy_(rows.repeat(1, HEADS) * 3)
        attention = model.transformer.h[0].attn.c_attn
        attention.bias.zero_()
        eye = torch.eye(width) * 2
        attention.weight[:, :width] = eye
        attention.weight[:, width : 2 * width] = eye * torch.linspace(0.5, 2, HEADS).repeat_interleave(HEAD_DIM)
    return model


def first_layer_logits(model) -> torch.Tensor:
    """(heads, n, n) first-layer logits, read from q and k as the attention gets them (after any rotation)."""
    seen = {}
    attention = model.transformer.h[0].attn
    hook = attention.c_attn.register_forward_hook(lambda m, i, out: seen.__setitem__("qkv", out.detach().clone()))
    with torch.no_grad():
        model(input_ids=torch.zeros(1, WINDOW, dtype=torch.long))
    hook.remove()
    q, k = seen["qkv"][0].split(HEADS * HEAD_DIM, -1)[:2]
    q, k = (x.view(WINDOW, HEADS, HEAD_DIM).transpose(0, 1) for x in (q, k))
    return (q @ k.transpose(-1, -2)).double() / math.sqrt(HEAD_DIM)


def r_squared(profile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> float:
    mean = (target * weights).sum(-1, keepdim=True) / weights.sum()
    residual = ((profile - target) ** 2 * weights).sum(-1)
    return float((1 - residual / ((target - mean) ** 2 * weights).sum(-1)).min())


@pytest.mark.parametrize("init, at_least, at_most", [("fit", 0.9, 1.0), (None, -math.inf, 0.1)])
def test_the_patched_first_layer_rebuilds_the_tables_logits(init, at_least, at_most):
    model = positional_gpt2()
    target, counts, _ = distance_profile(first_layer_logits(model), causal=True)
    posswap.patch(model, posswap.RopeConfig(max_length=4 * WINDOW, init=init))
    got, _, _ = distance_profile(first_layer_logits(model), causal=True)
    assert at_least <= r_squared(got, target, counts) <= at_most


def test_fit_refuses_a_kept_table():
    with pytest.raises(ValueError, match="init='fit' rebuilds what the dropped table did"):
        posswap.RopeConfig(max_length=512, init="fit", absolute="keep")


def test_a_partial_fit_writes_its_rotary_dims_only():
    """rotary_dim=0.5 (the copying study's rope-fit-partial): the fit rebuilds what half the frequencies can (far
    more than RoPE alone), and each head's unrotated dims keep their q/k biases."""
    model = positional_gpt2()
    target, counts, _ = distance_profile(first_layer_logits(model), causal=True)
    posswap.patch(model, posswap.RopeConfig(max_length=4 * WINDOW, init="fit", rotary_dim=0.5))
    got, _, _ = distance_profile(first_layer_logits(model), causal=True)
    assert r_squared(got, target, counts) >= 0.5

    model = positional_gpt2()
    bias = model.transformer.h[0].attn.c_attn.bias
    with torch.no_grad():
        bias.normal_()
    before = bias.detach().clone().view(3, HEADS, HEAD_DIM)
    posswap.patch(model, posswap.RopeConfig(max_length=4 * WINDOW, init="fit", rotary_dim=0.5))
    after = model.transformer.h[0].attn.c_attn.bias.detach().view(3, HEADS, HEAD_DIM)
    half = HEAD_DIM // 2
    torch.testing.assert_close(after[:2, :, half:], before[:2, :, half:], rtol=0, atol=0)  # q, k: unrotated dims
    torch.testing.assert_close(after[2], before[2], rtol=0, atol=0)  # v untouched
    assert not torch.equal(after[:2, :, :half], before[:2, :, :half])  # the rotary dims: the fitted biases
