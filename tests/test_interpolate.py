"""interpolate on every (architecture x head) and mode: runs at the new length, copy keeps short outputs,
same length is the identity, save -> posswap.from_pretrained round-trips."""

from __future__ import annotations

import logging

import pytest
import torch
import transformers
from conftest import MODEL_IDS, MODELS, OLD_LENGTH, make_model, outputs, reload_and_compare, token_ids

import posswap

NEW_LENGTH = 4 * OLD_LENGTH
MODES = ["copy", "linear", "cubic", "stride"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_patched_model_reads_max_length(model_type, head, mode):
    model = posswap.patch(make_model(model_type, head), posswap.InterpolateConfig(max_length=NEW_LENGTH, mode=mode))
    assert type(model).__name__ == head
    out = outputs(model, token_ids(NEW_LENGTH))
    assert out.shape[0] == 2 and torch.isfinite(out).all()
    offset = 2 if "roberta" in model_type else 0
    assert model.config.max_position_embeddings == NEW_LENGTH + offset
    sites = posswap.portable.posswap_architectures.find_sites(model)
    assert sites.table.weight.shape[0] == NEW_LENGTH + offset
    for name in ("position_ids", "token_type_ids"):
        if hasattr(sites.owner, name):
            assert getattr(sites.owner, name).shape == (1, NEW_LENGTH + offset)


@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_copy_keeps_outputs_within_old_length(model_type, head):
    ids = token_ids(OLD_LENGTH)
    model = make_model(model_type, head)
    before = outputs(model, ids)
    posswap.patch(model, posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="copy"))
    torch.testing.assert_close(outputs(model, ids), before, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type", ["bert", "roberta", "gpt2"])
def test_same_length_is_identity(model_type, mode):
    head = {"bert": "BertModel", "roberta": "RobertaModel", "gpt2": "GPT2Model"}[model_type]
    model = make_model(model_type, head)
    table = posswap.portable.posswap_architectures.find_sites(model).table.weight.detach().clone()
    ids = token_ids(OLD_LENGTH)
    before = outputs(model, ids)
    posswap.patch(model, posswap.InterpolateConfig(max_length=OLD_LENGTH, mode=mode))
    assert torch.equal(posswap.portable.posswap_architectures.find_sites(model).table.weight, table)
    assert torch.equal(outputs(model, ids), before)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_save_and_load_give_identical_logits(model_type, head, mode, tmp_path):
    model = posswap.patch(make_model(model_type, head), posswap.InterpolateConfig(max_length=NEW_LENGTH, mode=mode))
    loaded = reload_and_compare(model, tmp_path, NEW_LENGTH)
    assert loaded.config.posswap["method"] == "interpolate"
    assert loaded.config.posswap["mode"] == mode
    assert loaded.config.posswap["original_length"] == OLD_LENGTH
    assert loaded.config.posswap["version"] == posswap.__version__
    with pytest.raises(ValueError, match=f"at most {NEW_LENGTH} tokens"):
        loaded(input_ids=token_ids(NEW_LENGTH + 1))

    # Only sizes changed, so plain transformers loads it too.
    plain = getattr(transformers, head).from_pretrained(tmp_path).eval()
    ids = token_ids(NEW_LENGTH)
    assert torch.equal(outputs(plain, ids), outputs(model, ids))


def test_roberta_padding_rows_are_kept_and_padding_still_works():
    model = make_model("roberta", "RobertaModel")
    head_rows = model.embeddings.position_embeddings.weight[:2].detach().clone()
    posswap.patch(model, posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="linear"))
    assert torch.equal(model.embeddings.position_embeddings.weight[:2], head_rows)
    # A right-padded row gives the same real-token outputs as the row alone.
    ids = token_ids(NEW_LENGTH - 8, batch=1)
    padded = torch.cat([ids, torch.full((1, 8), model.config.pad_token_id)], dim=1)
    mask = (padded != model.config.pad_token_id).long()
    alone = model(input_ids=ids).last_hidden_state
    batched = model(input_ids=padded, attention_mask=mask).last_hidden_state[:, : ids.shape[1]]
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


def test_shrinking_is_refused_unless_asked_as_on_the_command_line():
    model = make_model("bert", "BertModel")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for method in ("interpolate", "rope", "alibi"):
        with pytest.raises(ValueError) as refused:
            posswap.patch(model, {"method": method, "max_length": OLD_LENGTH // 2})
        assert str(refused.value) == (
            f"max_length {OLD_LENGTH // 2} is below the {OLD_LENGTH} tokens this model reads: the patch would shrink "
            f"it. Give max_length {OLD_LENGTH} or more, or pass allow_shrink=True to shrink it."
        )
    assert model.config.max_position_embeddings == OLD_LENGTH and not hasattr(model.config, "posswap")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    posswap.patch(model, posswap.InterpolateConfig(max_length=OLD_LENGTH))  # the same length is no shrink


def test_shrinking_is_allowed_when_asked_and_said(caplog):
    model = make_model("bert", "BertModel")
    with caplog.at_level(logging.WARNING, logger="posswap"):
        posswap.patch(model, posswap.InterpolateConfig(max_length=OLD_LENGTH // 2, mode="copy"), allow_shrink=True)
    assert "Shrinking" in caplog.text
    assert model.config.max_position_embeddings == OLD_LENGTH // 2
    outputs(model, token_ids(OLD_LENGTH // 2))


def test_patching_twice_keeps_original_length_and_one_guard():
    model = make_model("gpt2", "GPT2Model")
    posswap.patch(model, posswap.InterpolateConfig(max_length=2 * OLD_LENGTH))
    posswap.patch(model, posswap.InterpolateConfig(max_length=NEW_LENGTH))
    assert model.config.posswap["original_length"] == OLD_LENGTH
    assert len(model._forward_pre_hooks) == 1
    outputs(model, token_ids(NEW_LENGTH))


def test_tokenizer_gets_new_model_max_length(minilm_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    model = make_model("bert", "BertModel")
    posswap.patch(model, posswap.InterpolateConfig(max_length=NEW_LENGTH), tokenizer=tokenizer)
    assert tokenizer.model_max_length == NEW_LENGTH
