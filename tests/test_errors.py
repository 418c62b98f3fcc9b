"""Bad input gets a clear error, and patch leaves the model exactly as it was."""

from __future__ import annotations

import pytest
import torch
import transformers
from conftest import OLD_LENGTH, assert_untouched, make_model, outputs, snapshot, token_ids

import posswap
from posswap.portable.posswap_architectures import ARCHITECTURES


@pytest.mark.parametrize("bad", [0, -8, 2.5, "2048", True, None])
def test_bad_max_length(bad):
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        posswap.InterpolateConfig(max_length=bad)


def test_unknown_mode():
    with pytest.raises(ValueError, match="mode must be one of 'copy', 'linear', 'cubic'"):
        posswap.InterpolateConfig(max_length=64, mode="nearest")


def test_config_from_dict_errors():
    with pytest.raises(ValueError, match="Unknown posswap method 'sinusoid'"):
        posswap.config_from_dict({"method": "sinusoid", "max_length": 64})
    with pytest.raises(ValueError, match="Unknown key.*lenght"):
        posswap.config_from_dict({"method": "interpolate", "max_length": 64, "lenght": 3})
    with pytest.raises(ValueError, match="needs 'max_length'"):
        posswap.config_from_dict({"method": "interpolate"})
    config = posswap.config_from_dict({"method": "interpolate", "max_length": 64, "mode": "cubic"})
    assert config == posswap.InterpolateConfig(max_length=64, mode="cubic")
    assert posswap.config_from_dict(config.to_dict()) == config


def test_unknown_model_type_lists_supported():
    # CTRL: a sinusoidal table of its own, not a learned one posswap patches.
    config = transformers.CTRLConfig(vocab_size=99, n_embd=16, n_layer=1, n_head=2, dff=32, n_positions=64)
    model = transformers.CTRLModel(config)
    before = snapshot(model)
    supported = ", ".join(sorted(ARCHITECTURES))
    with pytest.raises(ValueError, match=f"does not support model_type 'ctrl'.*Supported model types: {supported}\\."):
        posswap.patch(model, posswap.InterpolateConfig(max_length=64))
    assert_untouched(model, before)


@pytest.mark.parametrize(
    "model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM"), ("roberta", "RobertaModel")]
)
def test_too_long_input_names_the_limit(model_type, head):
    model = posswap.patch(make_model(model_type, head), posswap.InterpolateConfig(max_length=2 * OLD_LENGTH))
    with pytest.raises(
        ValueError, match=f"needs {2 * OLD_LENGTH + 1} positions.*at most {2 * OLD_LENGTH} tokens.*max_length"
    ):
        outputs(model, token_ids(2 * OLD_LENGTH + 1))
    outputs(model, token_ids(2 * OLD_LENGTH))  # the limit itself is fine


def test_too_long_generation_and_explicit_positions():
    model = posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), posswap.InterpolateConfig(max_length=OLD_LENGTH + 4))
    prompt = token_ids(OLD_LENGTH, batch=1)
    out = model(input_ids=prompt, use_cache=True)
    for _ in range(4):  # reach the limit through the cache
        step = out.logits[:, -1:].argmax(-1)
        out = model(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
    with pytest.raises(ValueError, match=f"at most {OLD_LENGTH + 4} tokens"):
        model(input_ids=step, past_key_values=out.past_key_values, use_cache=True)
    with pytest.raises(ValueError, match="needs 100 positions"):
        model(input_ids=token_ids(2, batch=1), position_ids=torch.tensor([[0, 99]]))


def test_errors_inside_patch_leave_model_untouched():
    model = make_model("bert", "BertForMaskedLM")
    before = snapshot(model)
    config = posswap.InterpolateConfig(max_length=64)
    config.mode = "nearest"  # edited after construction: patch validates again
    with pytest.raises(ValueError, match="mode must be one of"):
        posswap.patch(model, config)
    with pytest.raises(TypeError, match="tokenizer must be a transformers tokenizer"):
        posswap.patch(model, posswap.InterpolateConfig(max_length=64), tokenizer="bert-base-uncased")
    with pytest.raises(TypeError, match="must be a posswap config"):
        posswap.patch(model, 64)
    assert_untouched(model, before)
