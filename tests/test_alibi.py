"""alibi: slopes by the paper's rule, the bias shape, relative invariance, kernels agree (eager / SDPA / flex),
KV-cache and left-padded decoding, the dropped table trains cleanly, save -> load, errors, the real MiniLM."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import (
    MODEL_IDS,
    MODELS,
    assert_decoding_equals_full_pass,
    assert_kernels_agree,
    assert_untouched,
    make_model,
    outputs,
    reload_and_compare,
    snapshot,
    token_ids,
)

import posswap
import posswap.portable.posswap_attention
from posswap.portable.posswap_architectures import find_sites
from posswap.portable.posswap_functional import alibi_bias, alibi_slopes

NEW_LENGTH = 64


def patched(model_type, head, **kwargs):
    return posswap.patch(make_model(model_type, head), posswap.AlibiConfig(max_length=NEW_LENGTH, **kwargs))


# Values of the reference rule (ofirpress/attention_with_linear_biases, get_slopes), written out.
REFERENCE_SLOPES = {
    8: [2.0**-k for k in range(1, 9)],
    16: [2.0 ** (-k / 2) for k in range(1, 17)],
    # 12 heads: the 8-head slopes, then every other slope of the 16-head sequence (2^-0.5, 2^-1.5, ...).
    12: [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5],
}


@pytest.mark.parametrize("heads", sorted(REFERENCE_SLOPES))
def test_slopes_follow_the_paper(heads):
    torch.testing.assert_close(alibi_slopes(heads), torch.tensor(REFERENCE_SLOPES[heads]), rtol=1e-6, atol=0)


def test_bias_is_symmetric_or_causal():
    slopes, pos = alibi_slopes(4), torch.arange(6)
    sym = alibi_bias(slopes, pos, pos, symmetric=True)
    causal = alibi_bias(slopes, pos, pos, symmetric=False)
    assert sym.shape == causal.shape == (4, 6, 6)
    assert torch.equal(sym, sym.transpose(-1, -2))
    lower = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(causal[:, lower], sym[:, lower])  # the same on the keys a causal mask keeps
    assert causal[1, 5, 2] == -slopes[1] * 3 and sym[1, 2, 5] == -slopes[1] * 3


@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertModel")])
def test_eager_attention_weights_show_the_bias_direction(model_type, head):
    model = patched(model_type, head, backend="eager")
    # Zero queries and keys: the scores are the bias alone, so the weights are softmax(bias).
    module = find_sites(model).self_attentions()[0]
    q = k = v = torch.zeros(1, 4, 5, 8)
    _, weights = posswap.portable.posswap_attention.bias_eager_attention(module, q, k, v, None, scaling=1.0)
    expected_bias = alibi_bias(
        module.posswap_bias.slopes("cpu"), torch.arange(5), torch.arange(5), symmetric=model_type == "bert"
    )
    if model_type == "gpt2":
        assert torch.all(weights[0].triu(1) == 0)  # causal: no weight on later keys
        expected_bias = expected_bias.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf)
    else:
        assert torch.allclose(weights[0], weights[0].flip(-1, -2))  # symmetric
    torch.testing.assert_close(weights[0], torch.softmax(expected_bias, -1))


@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_patched_model_reads_max_length_without_table(model_type, head):
    model = patched(model_type, head)
    assert type(model).__name__ == head
    assert find_sites(model).table is None
    out = outputs(model, token_ids(NEW_LENGTH))
    assert torch.isfinite(out).all()
    with pytest.raises(ValueError, match=f"at most {NEW_LENGTH} tokens"):
        model(input_ids=token_ids(NEW_LENGTH + 1))


@pytest.mark.parametrize(
    "model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM")]
)
def test_shifting_position_ids_changes_nothing(model_type, head):
    model = patched(model_type, head)
    ids = token_ids(40)
    offset = 2 if model_type == "roberta" else 0
    positions = torch.arange(offset, 40 + offset).expand(2, -1)
    with torch.no_grad():
        base = model(input_ids=ids, position_ids=positions).logits
        shifted = model(input_ids=ids, position_ids=positions + 7).logits
    torch.testing.assert_close(shifted, base, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertModel")])
def test_kernels_agree(model_type, head):
    def build(backend):
        model = patched(model_type, head, backend=backend)
        assert model.config._attn_implementation == posswap.portable.posswap_attention.BIAS_IMPLEMENTATIONS[backend]
        return model

    assert_kernels_agree(model_type, build)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gpt2_kv_cache_decoding_equals_full_pass(backend):
    model = patched("gpt2", "GPT2LMHeadModel", backend=backend)
    assert_decoding_equals_full_pass(model, token_ids(12, batch=1), 5)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gpt2_left_padded_batch_equals_rows_alone(backend):
    model = patched("gpt2", "GPT2LMHeadModel", backend=backend)
    long, short = token_ids(14, batch=1, seed=3), token_ids(9, batch=1, seed=4)
    pad = model.config.eos_token_id
    batch = torch.cat([long, torch.cat([torch.full((1, 5), pad), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    with torch.no_grad():
        together = model(input_ids=batch, attention_mask=mask).logits
        torch.testing.assert_close(together[0], model(input_ids=long).logits[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(together[1, 5:], model(input_ids=short).logits[0], atol=1e-5, rtol=0)

        settings = dict(max_new_tokens=6, do_sample=False, pad_token_id=pad)
        generated = model.generate(input_ids=batch, attention_mask=mask, **settings)
        assert torch.equal(generated[0, 14:], model.generate(input_ids=long, **settings)[0, 14:])
        assert torch.equal(generated[1, 14:], model.generate(input_ids=short, **settings)[0, 9:])


@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM")])
def test_dropped_table_trains_without_unused_parameters(model_type, head):
    model = patched(model_type, head).train()
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    assert not any("wpe" in name or "position_embeddings" in name for name in names)
    ids = token_ids(NEW_LENGTH)
    model(input_ids=ids, labels=ids).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_keep_extends_the_table_by_copying():
    model = make_model("bert", "BertModel")
    old = find_sites(model).table.weight.detach().clone()
    posswap.patch(model, posswap.AlibiConfig(max_length=NEW_LENGTH, absolute="keep"))
    new = find_sites(model).table.weight
    assert (
        new.shape[0] == NEW_LENGTH and torch.equal(new[: old.shape[0]], old) and torch.equal(new[old.shape[0] :], old)
    )
    assert torch.isfinite(outputs(model, token_ids(NEW_LENGTH))).all()


@pytest.mark.parametrize("absolute", ["drop", "keep"])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "model_type,head", [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM")]
)
def test_save_and_load_give_identical_logits(model_type, head, backend, absolute, tmp_path):
    model = patched(model_type, head, backend=backend, absolute=absolute)
    loaded = reload_and_compare(model, tmp_path, NEW_LENGTH)
    assert type(loaded).__name__ == "Posswap" + head
    assert loaded.config._attn_implementation == posswap.portable.posswap_attention.BIAS_IMPLEMENTATIONS[backend]
    assert loaded.config.posswap["backend"] == backend and loaded.config.posswap["absolute"] == absolute
    assert (find_sites(loaded).table is None) == (absolute == "drop")


def test_backend_defaults_to_how_the_model_was_loaded():
    model = make_model("gpt2", "GPT2LMHeadModel")
    model.set_attn_implementation("eager")
    posswap.patch(model, posswap.AlibiConfig(max_length=NEW_LENGTH))
    assert model.config._attn_implementation == "posswap_bias_eager"
    assert model.config.posswap["backend"] == "eager"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(absolute="freeze"), "absolute must be one of 'drop', 'keep'; got 'freeze'"),
        (dict(backend="flash"), "backend must be one of 'sdpa', 'flex', 'eager'; got 'flash'"),
        (dict(symmetric="yes"), "symmetric must be true, false or None"),
        (dict(symmetric=1), "symmetric must be true, false or None"),
    ],
)
def test_bad_config_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        posswap.AlibiConfig(max_length=NEW_LENGTH, **kwargs)


def test_config_edited_after_construction_is_checked_and_model_untouched():
    model = make_model("gpt2", "GPT2LMHeadModel")
    before = snapshot(model)
    config = posswap.AlibiConfig(max_length=NEW_LENGTH)
    config.backend = "cuda"
    with pytest.raises(ValueError, match="backend must be one of"):
        posswap.patch(model, config)
    assert_untouched(model, before)
    assert model.config._attn_implementation == "sdpa"


def test_causal_bias_on_an_encoder_is_refused_and_model_untouched():
    model = make_model("bert", "BertModel")
    before = snapshot(model)
    with pytest.raises(ValueError, match="symmetric=False .* needs a causal model"):
        posswap.patch(model, posswap.AlibiConfig(max_length=NEW_LENGTH, symmetric=False))
    assert_untouched(model, before)
    assert not hasattr(find_sites(model).self_attentions()[0], "posswap_bias")


def test_keep_after_drop_is_refused_and_model_untouched():
    model = patched("gpt2", "GPT2LMHeadModel")
    before = snapshot(model)
    with pytest.raises(ValueError, match="absolute='keep' needs the learned position table"):
        posswap.patch(model, posswap.AlibiConfig(max_length=NEW_LENGTH, absolute="keep"))
    assert_untouched(model, before)
