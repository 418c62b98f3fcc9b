"""rope: relative invariance, KV cache = full pass, left padding, rotation math, scaling from transformers,
training with a dropped table, save/load, the real MiniLM at 2048."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import (
    MODEL_IDS,
    MODELS,
    OLD_LENGTH,
    TINY,
    assert_decoding_equals_full_pass,
    assert_untouched,
    make_model,
    outputs,
    reload_and_compare,
    sharpen_qk,
    snapshot,
    token_ids,
)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

import posswap
from posswap.portable.posswap_functional import (
    apply_rotary,
    rope_frequencies,
    rotary_cos_sin,
    rotate_in_place,
    signed_sin,
)

NEW_LENGTH = 4 * OLD_LENGTH


@pytest.mark.parametrize("backend", ["sdpa", "eager", "flex"])
@pytest.mark.parametrize(
    "model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertModel"), ("roberta", "RobertaForMaskedLM")]
)
def test_shifting_positions_leaves_outputs_unchanged(model_type, head, backend):
    model = posswap.patch(make_model(model_type, head), posswap.RopeConfig(max_length=NEW_LENGTH, backend=backend))
    ids = token_ids(48)
    positions = torch.arange(48)[None].expand(2, -1)
    torch.set_grad_enabled(False)  # flex attention has no backward on CPU
    base = model(input_ids=ids, position_ids=positions + (2 if "roberta" in model_type else 0))
    shifted = model(input_ids=ids, position_ids=positions + 37)
    torch.set_grad_enabled(True)
    key = "logits" if hasattr(base, "logits") else "last_hidden_state"
    torch.testing.assert_close(shifted[key], base[key], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_runs_max_length_without_a_table(model_type, head):
    model = posswap.patch(make_model(model_type, head), posswap.RopeConfig(max_length=NEW_LENGTH))
    assert not any("wpe" in n or "position_embeddings" in n for n, _ in model.named_parameters())
    out = outputs(model, token_ids(NEW_LENGTH))
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match=f"at most {NEW_LENGTH} tokens"):
        outputs(model, token_ids(NEW_LENGTH + 1))


def test_rotation_preserves_norms_and_leaves_other_dims():
    x = torch.randn(2, 10, 4, 16)
    inv_freq, _ = rope_frequencies(16, 8, 10000.0, None, 1.0, 512)
    cos, sin = rotary_cos_sin(inv_freq, torch.arange(10)[None])
    y = apply_rotary(x, cos, sin)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    assert torch.equal(y[..., 8:], x[..., 8:])
    assert not torch.allclose(y[:, 1:, :, :8], x[:, 1:, :, :8])
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position 0 is not rotated


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_rotation_in_place_equals_llamas_rotation_with_its_gradients(rotary_dim, dtype):
    """The run time rotates a q/k projection's output in place (no temporaries per chunk): values and gradients
    equal transformers' Llama rotation (apply_rotary: rotate_half) on a copy."""
    inv_freq, _ = rope_frequencies(16, rotary_dim, 10000.0, None, 1.0, 512)
    cos, sin = rotary_cos_sin(inv_freq, torch.arange(10)[None])
    weight = torch.randn(2 * 4 * 16, 8, requires_grad=True)
    inputs = torch.randn(3, 10, 8)

    def projected():  # a fused q|k projection, as GPT-2's c_attn: (batch, length, 2 chunks, heads, head_dim)
        return torch.nn.functional.linear(inputs, weight).to(dtype).view(3, 10, 2, 4, 16)

    expected = torch.stack([apply_rotary(projected()[:, :, i], cos, sin) for i in range(2)], dim=2)
    (expected.float() * torch.linspace(-1, 1, 16)).sum().backward()
    grad, weight.grad = weight.grad, None
    got = rotate_in_place(projected(), cos, signed_sin(sin))
    (got.float() * torch.linspace(-1, 1, 16)).sum().backward()
    torch.testing.assert_close(got, expected)
    loose = {} if dtype == torch.float32 else {"rtol": 0.02, "atol": 0.05}  # bf16 gradients, rounded in another order
    torch.testing.assert_close(weight.grad, grad, **loose)


@pytest.mark.parametrize("scaling", [None, "linear", "dynamic", "yarn"])
def test_frequencies_are_transformers_own(scaling):
    head_dim, factor, original = 64, 4.0, 512
    rope_type = scaling or "linear"
    params = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": factor if scaling else 1.0}
    if scaling == "yarn":
        params["original_max_position_embeddings"] = original
    config = transformers.LlamaConfig(
        hidden_size=768,
        num_attention_heads=12,
        head_dim=head_dim,
        max_position_embeddings=original,
        rope_parameters=params,
    )
    expected, expected_scale = ROPE_INIT_FUNCTIONS[rope_type](config, device=None, seq_len=2048)
    got, scale = rope_frequencies(head_dim, head_dim, 10000.0, scaling, factor, original, seq_len=2048)
    torch.testing.assert_close(got, expected)
    assert scale == pytest.approx(expected_scale)
    plain = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    if scaling is None:
        torch.testing.assert_close(got, plain)


@pytest.mark.parametrize("scaling", ["linear", "dynamic", "yarn"])
def test_scaled_model_runs_and_round_trips(scaling, tmp_path):
    model = posswap.patch(
        make_model("gpt2", "GPT2LMHeadModel"), posswap.RopeConfig(max_length=NEW_LENGTH, rope_type=scaling)
    )
    assert torch.isfinite(outputs(model, token_ids(NEW_LENGTH))).all()
    reload_and_compare(model, tmp_path, NEW_LENGTH)


@pytest.mark.parametrize("absolute", ["drop", "keep"])
def test_kv_cache_decoding_equals_full_pass(absolute):
    model = posswap.patch(
        make_model("gpt2", "GPT2LMHeadModel"), posswap.RopeConfig(max_length=NEW_LENGTH, absolute=absolute)
    )
    assert_decoding_equals_full_pass(model, token_ids(40, batch=1), 16, atol=1e-5, rtol=1e-5)


def test_bert_decoder_kv_cache_without_position_ids_equals_full_pass():
    """BERT passes no position_ids: every layer counts its positions from its own cache (not from layer 0's, which
    already holds the new tokens when the later layers run)."""
    torch.manual_seed(0)
    config = transformers.BertConfig(**TINY, max_position_embeddings=OLD_LENGTH, is_decoder=True)
    model = posswap.patch(
        sharpen_qk(transformers.BertLMHeadModel(config).eval()), posswap.RopeConfig(max_length=NEW_LENGTH)
    )
    assert_decoding_equals_full_pass(model, token_ids(20, batch=1), 8)


@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM")])
def test_training_step_with_gradient_checkpointing(model_type, head):
    model = posswap.patch(make_model(model_type, head), posswap.RopeConfig(max_length=NEW_LENGTH))
    model.train()
    model.gradient_checkpointing_enable()
    ids = token_ids(NEW_LENGTH)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert missing == [], missing  # nothing unused (DDP would fail), and no position table left


def test_bf16_model_is_finite_at_max_length():
    model = posswap.patch(
        make_model("gpt2", "GPT2LMHeadModel").to(torch.bfloat16),
        posswap.RopeConfig(max_length=NEW_LENGTH, rope_type="yarn"),
    )
    out = outputs(model, token_ids(NEW_LENGTH))
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    fp32 = posswap.patch(make_model("bert", "BertModel"), posswap.RopeConfig(max_length=NEW_LENGTH))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.isfinite(outputs(fp32, token_ids(NEW_LENGTH))).all()


def test_rotary_dim_rotates_only_part_of_each_head():
    model = make_model("bert", "BertModel")  # head_dim 8
    posswap.patch(model, posswap.RopeConfig(max_length=NEW_LENGTH, rotary_dim=0.5))
    assert model.posswap_rotary.rotary_dim == 4
    assert torch.isfinite(outputs(model, token_ids(NEW_LENGTH))).all()


@pytest.mark.parametrize(
    "model_type,head",
    [
        ("gpt2", "GPT2LMHeadModel"),
        ("xlm-roberta", "XLMRobertaForTokenClassification"),
        ("electra", "ElectraForPreTraining"),
    ],
)
@pytest.mark.parametrize("absolute", ["drop", "keep"])
def test_save_and_load_give_identical_logits(model_type, head, absolute, tmp_path):
    model = posswap.patch(make_model(model_type, head), posswap.RopeConfig(max_length=NEW_LENGTH, absolute=absolute))
    loaded = reload_and_compare(model, tmp_path, NEW_LENGTH)
    assert type(loaded).__name__ == "Posswap" + head  # the class the folder carries for trust_remote_code
    assert loaded.config.posswap["absolute"] == absolute


def test_keep_extends_the_table_by_copy():
    model = make_model("gpt2", "GPT2Model")
    old = model.wpe.weight.detach().clone()
    posswap.patch(model, posswap.RopeConfig(max_length=NEW_LENGTH, absolute="keep"))
    assert model.wpe.weight.shape[0] == NEW_LENGTH
    assert torch.equal(model.wpe.weight[:OLD_LENGTH], old)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(rope_type="ntk"), "rope_type must be one of"),
        (dict(factor=4.0), "factor only applies"),
        (dict(rope_type="yarn", factor=0.5), "factor must be a number >= 1"),
        (dict(rotary_dim=3), "rotary_dim must be"),
        (dict(rotary_dim=1.5), "rotary_dim must be"),
        (dict(theta=0), "theta must be"),
        (dict(absolute="zero"), "absolute must be one of"),
        (dict(backend="flash"), "backend must be one of"),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        posswap.RopeConfig(max_length=64, **kwargs)


def test_errors_leave_model_untouched():
    model = make_model("bert", "BertModel")  # head_dim 8
    before = snapshot(model)
    with pytest.raises(ValueError, match="gives 10 of 8 head dims"):
        posswap.patch(model, posswap.RopeConfig(max_length=64, rotary_dim=10))
    assert_untouched(model, before)
    posswap.patch(model, posswap.InterpolateConfig(max_length=64))
    before = snapshot(model)
    with pytest.raises(ValueError, match="already patched with 'interpolate'"):
        posswap.patch(model, posswap.RopeConfig(max_length=64))
    assert_untouched(model, before)
    assert isinstance(model.embeddings.position_embeddings, torch.nn.Embedding)
    assert not hasattr(model, "posswap_rotary")


@pytest.mark.parametrize(
    "model_type,head,targets", [("gpt2", "GPT2LMHeadModel", ["c_attn"]), ("bert", "BertModel", ["query", "key"])]
)
def test_lora_update_is_rotated_too(model_type, head, targets):
    from peft import LoraConfig, get_peft_model

    model = posswap.patch(make_model(model_type, head), posswap.RopeConfig(max_length=NEW_LENGTH))
    peft_model = get_peft_model(
        model, LoraConfig(r=4, target_modules=targets, fan_in_fan_out=model_type == "gpt2", init_lora_weights=False)
    )
    ids = token_ids(48)
    with_lora = outputs(peft_model, ids)
    # Merged weights through the plain projections must give the same outputs: the hooks followed the
    # LoRA wrappers and rotated base + LoRA output together, and come back to the merged modules.
    merged = peft_model.merge_and_unload()
    torch.testing.assert_close(outputs(merged, ids), with_lora, atol=1e-5, rtol=1e-5)
    shifted = merged(input_ids=ids, position_ids=torch.arange(48)[None] + 11)
    torch.testing.assert_close(shifted[0], with_lora, atol=1e-4, rtol=1e-4)  # still relative
