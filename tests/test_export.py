"""posswap export: RoPE models written as native transformers models (GPT-NeoX, RoFormer) that plain
transformers loads without trust_remote_code and that give the same logits and generations; refusals write nothing."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import transformers
from conftest import make_model, token_ids

import posswap
from posswap.cli import main
from posswap.data import GPT2_TOKENIZER_DIR

LENGTH = 128


def sharpened(model_type: str, head: str):
    """A tiny model whose q/k weights are scaled up, so that attention is peaked and positions change the logits."""
    model = make_model(model_type, head)
    for layer in model.base_model.h if model_type == "gpt2" else model.base_model.encoder.layer:
        if model_type == "gpt2":
            layer.attn.c_attn.weight.data[:, : 2 * model.config.n_embd] *= 8  # Conv1D (in, out): q and k columns
        else:
            layer.attention.self.query.weight.data *= 8
            layer.attention.self.key.weight.data *= 8
    return model


def rope_gpt2(head: str = "GPT2LMHeadModel", **options):
    return posswap.patch(sharpened("gpt2", head), posswap.RopeConfig(max_length=LENGTH, **options))


def left_padded_batch():
    pad = 98  # the tiny GPT-2's eos, used as padding
    long, short = token_ids(12, batch=1, seed=3), token_ids(7, batch=1, seed=4)
    batch = torch.cat([long, torch.cat([torch.full((1, 5), pad), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    return batch, mask


@pytest.mark.parametrize("rotary_dim", [None, 0.5], ids=["full", "half"])
@pytest.mark.parametrize("scaling", [None, "linear", "yarn"])
def test_gpt2_rope_exports_to_gpt_neox(tmp_path, scaling, rotary_dim):
    model = rope_gpt2(rope_type=scaling, rotary_dim=rotary_dim)
    result = posswap.export(model, tmp_path / "neox")
    assert result.architecture == "GPTNeoXForCausalLM" and result.max_difference < 1e-4

    native = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "neox").eval()  # no trust_remote_code
    assert isinstance(native, transformers.GPTNeoXForCausalLM)
    saved = json.loads((tmp_path / "neox" / "config.json").read_text())
    assert saved["rotary_pct"] == (rotary_dim or 1.0) and saved["rope_parameters"]["partial_rotary_factor"] == (
        rotary_dim or 1.0
    )
    assert saved["rope_parameters"]["rope_type"] == (scaling or "default")
    ids = token_ids(LENGTH)
    torch.testing.assert_close(native(ids).logits, model(ids).logits, atol=1e-4, rtol=0)

    # Greedy generation with left padding: generate derives position ids from the mask for both models.
    batch, mask = left_padded_batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=98)
    assert torch.equal(native.generate(batch, **kwargs), model.generate(batch, **kwargs))


def test_gpt2_base_model_exports_to_gpt_neox_model(tmp_path):
    model = rope_gpt2("GPT2Model", rotary_dim=0.5).train()
    assert posswap.export(model, tmp_path / "neox").architecture == "GPTNeoXModel"
    assert model.training and all(p.dtype == torch.float32 for p in model.parameters())  # given back as it was
    model.eval()
    native = transformers.AutoModel.from_pretrained(tmp_path / "neox")
    ids = token_ids(LENGTH)
    torch.testing.assert_close(native(ids).last_hidden_state, model(ids).last_hidden_state, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "model_type,head,auto",
    [
        ("bert", "BertForMaskedLM", "AutoModelForMaskedLM"),
        ("bert", "BertModel", "AutoModel"),
        ("roberta", "RobertaForMaskedLM", "AutoModelForMaskedLM"),
        ("xlm-roberta", "XLMRobertaForTokenClassification", "AutoModelForTokenClassification"),
        ("electra", "ElectraForMaskedLM", "AutoModelForMaskedLM"),  # embedding_size 16 -> RoFormer's projection
    ],
)
def test_encoder_rope_exports_to_roformer(tmp_path, model_type, head, auto):
    model = posswap.patch(sharpened(model_type, head), posswap.RopeConfig(max_length=LENGTH))
    result = posswap.export(model, tmp_path / "roformer")
    assert result.architecture.startswith("RoFormer") and result.max_difference < 1e-4
    native = getattr(transformers, auto).from_pretrained(tmp_path / "roformer").eval()
    assert type(native).__name__ == result.architecture
    ids = token_ids(100)
    out, expected = native(ids), model(ids)
    key = "last_hidden_state" if head.endswith("Model") else "logits"
    torch.testing.assert_close(out[key], expected[key], atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "model_type,head,config,message",
    [
        ("gpt2", "GPT2LMHeadModel", posswap.AlibiConfig(max_length=LENGTH), "computes 'alibi'"),
        ("gpt2", "GPT2LMHeadModel", posswap.RopeConfig(max_length=LENGTH, rope_type="dynamic"), "dynamic scaling"),
        ("gpt2", "GPT2LMHeadModel", posswap.RopeConfig(max_length=LENGTH, absolute="keep"), "absolute='keep'"),
        ("gpt2", "GPT2ForSequenceClassification", posswap.RopeConfig(max_length=LENGTH), "GPT-NeoX counterpart"),
        ("bert", "BertForMaskedLM", posswap.RopeConfig(max_length=LENGTH, theta=5e5), "theta 10000"),
        ("bert", "BertForMaskedLM", posswap.RopeConfig(max_length=LENGTH, rotary_dim=0.5), "whole heads"),
        ("bert", "BertForSequenceClassification", posswap.RopeConfig(max_length=LENGTH), "tanh pooler"),
        ("electra", "ElectraForPreTraining", posswap.RopeConfig(max_length=LENGTH), "no head like"),
    ],
)
def test_no_exact_target_is_refused_and_writes_nothing(tmp_path, model_type, head, config, message):
    model = posswap.patch(make_model(model_type, head), config)
    with pytest.raises(ValueError, match=message) as error:
        posswap.export(model, tmp_path / "out")
    assert "trust_remote_code=True" in str(error.value) and "\n" not in str(error.value)
    assert list(tmp_path.iterdir()) == []


def test_interpolate_is_already_native(tmp_path):
    model = posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), posswap.InterpolateConfig(max_length=LENGTH))
    with pytest.raises(ValueError, match="already native"):
        posswap.export(model, tmp_path / "out")


def test_non_empty_out_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("not posswap's")
    with pytest.raises(ValueError, match="not empty"):
        posswap.export(rope_gpt2(), tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]
    posswap.export(rope_gpt2(), tmp_path / "empty")  # a missing folder is fine, and so is an empty one
    (tmp_path / "empty2").mkdir()
    posswap.export(rope_gpt2(), tmp_path / "empty2")


@pytest.fixture
def saved(tmp_path):
    """Save a patched tiny GPT-2 with the real GPT-2 tokenizer; returns the folder."""

    def save(config):
        tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
        torch.manual_seed(0)
        gpt2 = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=32)
        model = posswap.patch(transformers.GPT2LMHeadModel(gpt2), config, tokenizer=tokenizer)
        folder = tmp_path / config.method
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return folder

    return save


def test_cli_export_writes_model_and_tokenizer(saved, tmp_path, capsys):
    folder = saved(posswap.RopeConfig(max_length=LENGTH, rope_type="yarn"))
    assert main(["export", str(folder), "--out", str(tmp_path / "neox")]) == 0
    assert "as GPTNeoXForCausalLM" in capsys.readouterr().out
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "neox")
    native = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "neox")
    ids = tokenizer("It is a truth universally acknowledged", return_tensors="pt").input_ids
    torch.testing.assert_close(native(ids).logits, posswap.from_pretrained(str(folder))(ids).logits, atol=1e-4, rtol=0)
    assert tokenizer.model_max_length == LENGTH


def test_cli_export_refusal_is_one_line(saved, tmp_path, capsys):
    folder = saved(posswap.AlibiConfig(max_length=LENGTH))
    assert main(["export", str(folder), "--out", str(tmp_path / "never")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("posswap export: error:")]
    assert (
        len(errors) == 1
        and "No exact native export for GPT2LMHeadModel" in errors[0]
        and "trust_remote_code" in errors[0]
    )
    assert not (tmp_path / "never").exists()


def test_an_export_is_pushed_with_posswap_push(hub, saved, tmp_path, capsys):
    folder = saved(posswap.RopeConfig(max_length=LENGTH))
    assert main(["export", str(folder), "--out", str(tmp_path / "neox")]) == 0
    assert f"posswap push {tmp_path / 'neox'} REPO_ID" in capsys.readouterr().out  # the one way to push
    assert main(["push", str(tmp_path / "neox"), "me/gpt2-neox", "--results", "r.json"]) == 2  # no posswap card
    assert "no posswap block" in capsys.readouterr().err
    assert main(["push", str(tmp_path / "neox"), "me/gpt2-neox"]) == 0
    files = hub.files("me/gpt2-neox")
    assert "README.md" not in files  # a native folder goes up as it is
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert json.loads(files["config.json"])["model_type"] == "gpt_neox"
    assert files["model.safetensors"] == (tmp_path / "neox" / "model.safetensors").read_bytes()


@pytest.mark.parametrize(
    "model_type,head,mapping",
    [("gpt2", "GPT2LMHeadModel", "_qkv_per_head"), ("bert", "BertForMaskedLM", "_interleaved")],
)
def test_a_wrong_mapping_is_caught_by_the_logit_check(tmp_path, monkeypatch, model_type, head, mapping):
    module = importlib.import_module("posswap.export")  # the attribute posswap.export is the function
    monkeypatch.setattr(module, mapping, lambda weight, heads: weight)  # e.g. q/k rows left half-split
    model = posswap.patch(sharpened(model_type, head), posswap.RopeConfig(max_length=LENGTH))
    with pytest.raises(ValueError, match="differs from the posswap model by .* nothing was written"):
        posswap.export(model, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_the_recommended_rope_retrofit_exports_to_gpt_neox(tmp_path):
    """RopeConfig(init="fit", rotary_dim=0.5) (docs/methods/rope.md): the fitted first-layer q/k biases travel as
    GPT-NeoX's qkv bias, and the native model gives the patched model's logits."""
    model = rope_gpt2(init="fit", rotary_dim=0.5)
    width = model.config.n_embd
    head_dim = width // model.config.n_head
    qk_bias = model.transformer.h[0].attn.c_attn.bias.detach()[: 2 * width].view(2, -1, head_dim)
    assert qk_bias[..., : head_dim // 2].abs().amax() > 0  # the fit wrote biases on the rotary dims: they must travel
    result = posswap.export(model, tmp_path / "neox")
    assert result.architecture == "GPTNeoXForCausalLM" and result.max_difference < 1e-4
    native = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "neox").eval()
    ids = token_ids(LENGTH)
    torch.testing.assert_close(native(ids).logits, model(ids).logits, atol=1e-4, rtol=0)
