"""tupe: first-layer scores by hand (correlation, [CLS] reset, T5 buckets), kernels agree, what is and is not
shift-invariant, KV cache and left padding, save -> load with the new parameters, errors, the real MiniLM."""

from __future__ import annotations

import math

import pytest
import torch
import transformers
from conftest import (
    assert_decoding_equals_full_pass,
    assert_kernels_agree,
    assert_untouched,
    make_model,
    outputs,
    reload_and_compare,
    sharpen_qk,
    snapshot,
    token_ids,
)
from transformers.models.t5.modeling_t5 import T5Attention

import posswap
from posswap.training.trainable import position_parameter_names

NEW_LENGTH = 64


def patched(model_type, head, **kwargs):
    return posswap.patch(
        sharpen_qk(make_model(model_type, head)), posswap.TupeConfig(max_length=NEW_LENGTH, **kwargs)
    ).eval()


def provider(model):
    return model.base_model.posswap_bias_providers[0]


@torch.no_grad()
def scramble(model, seed=0):
    """Move every new parameter off its initial value (the relative table starts at zero)."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in model.named_parameters():
        if "posswap_bias_providers" in name:
            parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.detach().std().clamp_min(0.5))
    return model


def test_bert_first_layer_scores_equal_the_paper():
    model = scramble(patched("bert", "BertModel", relative=True, backend="eager"))
    n, heads, d = 20, 4, 8
    ids = token_ids(n, batch=1)
    with torch.no_grad():
        got = model(ids, output_attentions=True).attentions[0][0]
        x = model.embeddings(input_ids=ids)[0]  # the table is dropped: token + type vectors only
        attention = model.encoder.layer[0].attention.self
        q, k = (proj(x).view(n, heads, d).transpose(0, 1) for proj in (attention.query, attention.key))
        p = provider(model)
        pq = (p.positions[:n] @ p.query).view(n, heads, d).transpose(0, 1)
        pk = (p.positions[:n] @ p.key).view(n, heads, d).transpose(0, 1)
        correlation = pq @ pk.transpose(-1, -2) / math.sqrt(2 * d)
        correlation[:, 1:, 0] = p.others_to_cls[:, None]  # every position -> [CLS]: theta_2
        correlation[:, 0, :] = p.cls_to_others[:, None]  # [CLS] -> every position: theta_1
        distance = torch.arange(n)[None] - torch.arange(n)[:, None]  # key minus query, as T5
        buckets = T5Attention._relative_position_bucket(distance, True, 32, 128)
        relative = p.relative.relative_attention_bias.weight[buckets].permute(2, 0, 1)
    expected = (q @ k.transpose(-1, -2) / math.sqrt(d) + correlation + relative).softmax(-1)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_the_correlation_starts_as_the_first_layers_position_term():
    model = patched("gpt2", "GPT2LMHeadModel")
    p, c_attn, hidden = provider(model), model.transformer.h[0].attn.c_attn, 32
    table = make_model("gpt2", "GPT2LMHeadModel").transformer.wpe.weight.detach()  # the original table
    with torch.no_grad():
        pq = (table @ c_attn.weight[:, :hidden]).view(32, 4, 8).transpose(0, 1)
        pk = (table @ c_attn.weight[:, hidden : 2 * hidden]).view(32, 4, 8).transpose(0, 1)
        expected = pq @ pk.transpose(-1, -2) / math.sqrt(8)  # the original's scaling: 1/sqrt(d), not 1/sqrt(2d)
        positions = torch.arange(32)[None]
        torch.testing.assert_close(p.correlation(positions, positions)[0], expected, atol=1e-5, rtol=1e-4)
        assert torch.equal(p.positions[32:], p.positions[:32])  # mode copy: rows tiled
    assert model.config.posswap["cls_reset"] is False  # decoders: no [CLS]


@pytest.mark.parametrize("relative", [False, True])
@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("roberta", "RobertaModel")])
def test_kernels_agree(model_type, head, relative):
    assert_kernels_agree(
        model_type, lambda backend: scramble(patched(model_type, head, backend=backend, relative=relative))
    )


def test_gpt2_tupe_r_is_absolute_but_its_relative_part_is_shift_invariant():
    model = scramble(patched("gpt2", "GPT2LMHeadModel", relative=True))
    ids, positions = token_ids(30), torch.arange(30).expand(2, -1)

    def shifted_difference():
        with torch.no_grad():
            return (
                (model(ids, position_ids=positions + 9).logits - model(ids, position_ids=positions).logits).abs().max()
            )

    assert shifted_difference() > 1e-3
    with torch.no_grad():
        provider(model).query.zero_()  # the correlation gone: T5's buckets alone
    assert shifted_difference() < 1e-5


def test_tupe_bert_is_not_permutation_equivariant():
    model = scramble(patched("bert", "BertModel"))
    ids, order = token_ids(24), torch.randperm(24, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = outputs(model, ids)[:, order], outputs(model, ids[:, order])
    assert (a - b).abs().max() > 1e-2


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gpt2_kv_cache_decoding_equals_full_pass(backend):
    model = scramble(patched("gpt2", "GPT2LMHeadModel", backend=backend, relative=True, cls_reset=True))
    assert_decoding_equals_full_pass(model, token_ids(12, batch=1), 5)


def test_gpt2_left_padding_with_positions_from_the_mask_equals_rows_alone():
    """Also decoding with the cache: keys keep their real positions (the pads are not counted)."""
    model = scramble(patched("gpt2", "GPT2LMHeadModel", cls_reset=True))
    long, short = token_ids(14, batch=1, seed=3), token_ids(9, batch=1, seed=4)
    batch = torch.cat([long, torch.cat([torch.full((1, 5), 98), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        together = model(input_ids=batch, attention_mask=mask, position_ids=positions).logits
        alone = model(input_ids=short).logits
        torch.testing.assert_close(together[1, 5:], alone[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(together[0], model(input_ids=long).logits[0], atol=1e-5, rtol=0)
        out = model(
            input_ids=batch[:, :10], attention_mask=mask[:, :10], position_ids=positions[:, :10], use_cache=True
        )
        step = model(
            input_ids=batch[:, 10:11],
            attention_mask=mask[:, :11],
            position_ids=positions[:, 10:11],
            past_key_values=out.past_key_values,
            use_cache=True,
        ).logits
    torch.testing.assert_close(step[1, 0], alone[0, 5], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "model_type,head,kwargs",
    [
        ("gpt2", "GPT2LMHeadModel", {"relative": True}),
        ("roberta", "RobertaForMaskedLM", {"mode": "linear"}),
        ("electra", "ElectraForPreTraining", {"relative": True, "backend": "eager"}),
    ],
    ids=["gpt2-r", "roberta", "electra-r"],
)
def test_save_and_load_restore_the_new_parameters(model_type, head, kwargs, tmp_path):
    model = scramble(patched(model_type, head, **kwargs))
    loaded = reload_and_compare(model, tmp_path, NEW_LENGTH)
    theirs = {n: p for n, p in loaded.named_parameters() if "posswap_" in n}
    ours = {n: p for n, p in model.named_parameters() if "posswap_" in n}
    assert theirs.keys() == ours.keys() and len(ours) >= 3
    assert all(torch.equal(theirs[n], ours[n]) for n in ours)
    assert loaded.config.posswap == model.config.posswap


def test_a_failure_inside_patch_leaves_the_model_untouched(monkeypatch):
    model = sharpen_qk(make_model("gpt2", "GPT2LMHeadModel"))
    before, modules = snapshot(model), dict(model.transformer.named_children())

    def refuse(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)
    with pytest.raises(RuntimeError, match="injected failure"):
        posswap.patch(model, posswap.TupeConfig(max_length=NEW_LENGTH, relative=True))
    assert_untouched(model, before)
    assert dict(model.transformer.named_children()) == modules and not hasattr(model.config, "posswap")


def test_a_model_without_its_table_is_refused_untouched():
    model = posswap.patch(make_model("bert", "BertModel"), posswap.AlibiConfig(max_length=NEW_LENGTH))
    model.config.posswap = None  # not the "already patched" error: the table itself is gone
    before = snapshot(model)
    with pytest.raises(ValueError, match="tupe starts from the learned position table"):
        posswap.patch(model, posswap.TupeConfig(max_length=NEW_LENGTH))
    assert_untouched(model, before)


@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("roberta", "RobertaModel")])
def test_too_long_input_is_a_clear_error(model_type, head):
    model = patched(model_type, head)
    assert torch.isfinite(outputs(model, token_ids(NEW_LENGTH))).all()
    with pytest.raises(ValueError, match=f"at most {NEW_LENGTH} tokens"):
        model(input_ids=token_ids(NEW_LENGTH + 1))


@pytest.mark.parametrize(
    "bad",
    [
        {"cls_reset": "yes"},
        {"relative": 1},
        {"mode": "nearest"},
        {"backend": "flash"},
        {"max_length": 0},
    ],
)
def test_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        posswap.config_from_dict({"method": "tupe", "max_length": NEW_LENGTH, **bad})


def test_positions_training_covers_the_new_parameters():
    model = patched("bert", "BertForMaskedLM", relative=True)
    names = position_parameter_names(model)
    assert {n.rsplit(".", 1)[-1] for n in names} == {
        "positions",
        "query",
        "key",
        "cls_to_others",
        "others_to_cls",
        "weight",
    }
    assert all("posswap_bias_providers" in n for n in names)


def test_electra_without_an_embedding_projection_patches():
    """ELECTRA has embeddings_project only when its embedding size differs from the hidden size."""
    config = transformers.ElectraConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        embedding_size=32,
        max_position_embeddings=32,
    )
    model = posswap.patch(transformers.ElectraForMaskedLM(config).eval(), posswap.TupeConfig(max_length=64))
    assert torch.isfinite(model(token_ids(50)).logits).all()
