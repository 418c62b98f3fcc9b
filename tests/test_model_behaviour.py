"""A patched model behaves like a model: reference scores recomputed by hand, positions that matter, deepcopy,
dtype casts, bad position_ids, re-patching, and patch undone when apply fails half-way."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import assert_untouched, make_model, sharpen_qk, snapshot

import posswap

NEW_LENGTH = 96


def gpt2(config):
    return posswap.patch(sharpen_qk(make_model("gpt2", "GPT2LMHeadModel")), config).eval()


def first_layer_qk(model, ids):
    """Queries and keys of GPT-2's first layer, unrotated, straight from its weights: (heads, n, head_dim)."""
    h = model.transformer.wte(ids)  # the table is dropped: embeddings are the token vectors alone
    x = model.transformer.h[0].ln_1(h)[0]
    c_attn = model.transformer.h[0].attn.c_attn  # by hand: calling it would run posswap's rotation hook
    q, k, _ = (x @ c_attn.weight + c_attn.bias).split(model.config.hidden_size, dim=-1)
    heads = model.config.num_attention_heads
    return [t.view(t.shape[0], heads, -1).transpose(0, 1) for t in (q, k)]


def textbook_rotation(x, theta=10000.0):
    """RoPE as Su et al. write it, on half-split pairs (x_i, x_{i+d/2}) rotated by pos * theta^(-2i/d)."""
    n, d = x.shape[-2], x.shape[-1]
    angle = torch.arange(n)[:, None].double() * theta ** (-torch.arange(0, d, 2).double() / d)
    pairs = torch.complex(x[..., : d // 2].double(), x[..., d // 2 :].double()) * torch.polar(
        torch.ones_like(angle), angle
    )
    return torch.cat([pairs.real, pairs.imag], dim=-1).float()


def causal_softmax(scores):
    n = scores.shape[-1]
    return scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)


def test_rope_first_layer_attention_equals_the_textbook():
    model = gpt2(posswap.RopeConfig(max_length=NEW_LENGTH, backend="eager"))
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids, output_attentions=True).attentions[0][0]
        q, k = first_layer_qk(model, ids)
    expected = causal_softmax(textbook_rotation(q) @ textbook_rotation(k).transpose(-1, -2) / math.sqrt(q.shape[-1]))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_alibi_first_layer_attention_equals_the_paper():
    model = gpt2(posswap.AlibiConfig(max_length=NEW_LENGTH, backend="eager"))
    ids = torch.randint(3, 99, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = model(ids, output_attentions=True).attentions[0][0]
        q, k = first_layer_qk(model, ids)
    heads = model.config.num_attention_heads
    slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])  # Press et al., heads a power of 2
    distance = torch.arange(20)[:, None] - torch.arange(20)[None]
    expected = causal_softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) - slopes[:, None, None] * distance)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "config",
    [posswap.RopeConfig(max_length=NEW_LENGTH), posswap.AlibiConfig(max_length=NEW_LENGTH)],
    ids=["rope", "alibi"],
)
def test_a_pose_jump_in_position_ids_changes_the_outputs(config):
    model = gpt2(config)
    ids = torch.randint(3, 99, (1, 30), generator=torch.Generator().manual_seed(0))
    contiguous = torch.arange(30)[None]
    jumped = torch.cat([torch.arange(15), torch.arange(15) + 60])[None]
    with torch.no_grad():
        a, b = model(ids, position_ids=contiguous).logits, model(ids, position_ids=jumped).logits
    torch.testing.assert_close(a[:, :15], b[:, :15])  # before the jump nothing differs
    assert (a[:, 15:] - b[:, 15:]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "config",
    [posswap.RopeConfig(max_length=NEW_LENGTH), posswap.AlibiConfig(max_length=NEW_LENGTH)],
    ids=["rope", "alibi"],
)
def test_deepcopy_runs_on_its_own_state(config, tmp_path):
    model = gpt2(config)
    model.save_pretrained(tmp_path)
    twin = copy.deepcopy(model)
    fresh = posswap.from_pretrained(str(tmp_path)).eval()
    short, long = (torch.randint(3, 99, (1, n), generator=torch.Generator().manual_seed(n)) for n in (17, 70))
    with torch.no_grad():  # interleaved, so a state shared with the original would show
        for first, second in ((model, twin), (twin, model)):
            a, b = first(long).logits, second(short).logits
            torch.testing.assert_close(a, fresh(long).logits)
            torch.testing.assert_close(b, fresh(short).logits)


@pytest.mark.parametrize(
    "config", [posswap.RopeConfig(max_length=4096), posswap.AlibiConfig(max_length=4096)], ids=["rope", "alibi"]
)
def test_half_precision_keeps_frequencies_and_slopes_in_fp32(config):
    model = gpt2(config).to(torch.bfloat16)
    ids = torch.randint(3, 99, (1, 8))
    used = []  # the cos/sin the forward rotates with
    if config.method == "rope":
        rotary = model.transformer.posswap_rotary
        cos_sin = rotary.cos_sin
        rotary.cos_sin = lambda positions: used.append(cos_sin(positions)) or used[-1]
    with torch.no_grad():
        model(ids, position_ids=torch.tensor([[4000 + i for i in range(8)]]))
    if config.method == "rope":
        inv_freq, _ = model.transformer.posswap_rotary.frequencies(torch.device("cpu"))
        assert inv_freq.dtype == torch.float32
        assert len(used) == 1  # once per forward, shared by the layers
        cos = used[0][0]
        assert cos.dtype == torch.float32
        # fp32 angles at 4000: a bf16 inv_freq would be off by whole radians
        torch.testing.assert_close(cos[0, -1, 0], torch.cos(torch.tensor(4007.0)), atol=1e-3, rtol=0)
    else:
        slopes = model.transformer.h[0].attn.posswap_bias.slopes("cpu")
        assert slopes.dtype == torch.float32 and slopes[0] == 2**-2


@pytest.mark.parametrize("method", ["rope", "alibi", "interpolate"])
@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertModel")])
@pytest.mark.parametrize(
    "position_ids,message",
    [
        (torch.tensor([[-1, 0, 1, 2]]), "position_ids must be >= 0"),
        (torch.tensor([[0.0, 1.0, 2.0, 3.0]]), "position_ids must be an integer tensor"),
    ],
    ids=["negative", "float"],
)
def test_bad_position_ids_are_refused(method, model_type, head, position_ids, message):
    model = posswap.patch(
        make_model(model_type, head), posswap.config_from_dict({"method": method, "max_length": NEW_LENGTH})
    )
    with pytest.raises(ValueError, match=message):
        model(input_ids=torch.randint(3, 99, (1, 4)), position_ids=position_ids)


def test_repatching_interpolate_with_another_mode_is_refused():
    model = posswap.patch(
        make_model("gpt2", "GPT2LMHeadModel"), posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="copy")
    )
    before = snapshot(model)
    with pytest.raises(ValueError, match="already extended with mode 'copy'"):
        posswap.patch(model, posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="linear"))
    assert_untouched(model, before)


@pytest.mark.parametrize(
    "first,second",
    [
        (dict(method="rope", theta=10000.0), dict(method="rope", theta=500.0, rope_type="yarn")),
        (dict(method="alibi", backend="eager"), dict(method="alibi", backend="sdpa", absolute="drop")),
    ],
    ids=["rope", "alibi"],
)
def test_repatching_with_other_settings_applies_them(first, second):
    """The same method with other settings is applied for real: as if patched so from the start."""
    ids = torch.randint(3, 99, (1, 50), generator=torch.Generator().manual_seed(0))
    twice = posswap.patch(gpt2({**first, "max_length": 64}), {**second, "max_length": NEW_LENGTH})
    once = gpt2({**second, "max_length": NEW_LENGTH})
    with torch.no_grad():
        torch.testing.assert_close(twice(ids).logits, once(ids).logits)
    assert twice.config.posswap == once.config.posswap


@pytest.mark.parametrize("method", ["rope", "alibi"])
def test_a_failure_inside_apply_leaves_the_model_untouched(method, monkeypatch):
    model = sharpen_qk(make_model("gpt2", "GPT2LMHeadModel"))
    ids = torch.randint(3, 99, (1, 20))
    with torch.no_grad():
        expected = model(ids).logits
    before, config_class, modules = snapshot(model), type(model.config), dict(model.transformer.named_children())

    def refuse(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)
    with pytest.raises(RuntimeError, match="injected failure"):
        posswap.patch(model, posswap.config_from_dict({"method": method, "max_length": NEW_LENGTH, "backend": "eager"}))
    assert_untouched(model, before)
    assert type(model.config) is config_class and dict(model.transformer.named_children()) == modules
    assert not hasattr(model.config, "posswap") and not hasattr(model.transformer, "posswap_rotary")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected)
