"""t5-bias: first-layer scores by hand with T5's own buckets, zero init = no positions at all, shift invariance,
shared / per-layer tables, init="fit" against independently computed bucket means, kernels agree, KV cache,
left padding, save -> load with the tables restored, untouched on failure, trainable positions, the real MiniLM."""

from __future__ import annotations

import copy
import math

import pytest
import torch
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
from posswap.portable.posswap_architectures import find_sites
from posswap.portable.posswap_attention import BIAS_IMPLEMENTATIONS
from posswap.portable.posswap_runtime import NoPositions
from posswap.training.trainable import select_trainable

NEW_LENGTH = 64
GPT2, BERT = ("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM")


def patched(model_type, head, seed=0, **kwargs):
    model = sharpen_qk(make_model(model_type, head, seed=seed))
    return posswap.patch(model, posswap.T5BiasConfig(max_length=NEW_LENGTH, **kwargs))


def tables(model) -> list[torch.nn.Parameter]:
    return [p.relative_attention_bias.weight for p in model.base_model.posswap_bias_providers]


def fill_tables(model, seed=0):
    """Non-zero bucket biases (zero ones would hide every position effect)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for table in tables(model):
            table.copy_(torch.randn(table.shape, generator=generator))
    return model


def sinusoid_table(model, scale=0.05):
    """A table whose rows vary smoothly with position: a first layer that reads it has relative structure to fit."""
    table = find_sites(model).table.weight
    rows, dim = table.shape
    angle = torch.arange(rows)[:, None] / 10 ** (torch.arange(0, dim, 2) / dim)
    with torch.no_grad():
        table.copy_(torch.stack([angle.sin(), angle.cos()], -1).flatten(1) * scale)
    return model


def first_layer_qk(model, ids):
    """(heads, n, head_dim) queries and keys of the first layer, from its weights (the table is dropped)."""
    hidden, heads = model.config.hidden_size, model.config.num_attention_heads
    if model.config.model_type == "gpt2":
        attention = model.transformer.h[0].attn
        x = model.transformer.h[0].ln_1(model.transformer.wte(ids))[0]
        q, k, _ = (x @ attention.c_attn.weight + attention.c_attn.bias).split(hidden, -1)
    else:
        attention = model.bert.encoder.layer[0].attention.self
        x = model.bert.embeddings(input_ids=ids)[0]  # word + token type 0, LayerNorm; no position table
        q, k = attention.query(x), attention.key(x)
    return [t.view(t.shape[0], heads, -1).transpose(0, 1) for t in (q, k)]


@pytest.mark.parametrize("model_type,head", [GPT2, BERT])
def test_first_layer_scores_equal_t5_buckets_by_hand(model_type, head):
    model = patched(model_type, head, num_buckets=8, max_distance=16, backend="eager")  # log buckets within 40 tokens
    heads, n, causal = model.config.num_attention_heads, 40, model_type == "gpt2"
    hand_made = torch.arange(8 * heads, dtype=torch.float).view(8, heads).sin() * 2
    with torch.no_grad():
        tables(model)[0].copy_(hand_made)
        ids = token_ids(n, batch=1)
        got = model(ids, output_attentions=True).attentions[0][0]
        q, k = first_layer_qk(model, ids)
    memory_minus_query = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    buckets = T5Attention._relative_position_bucket(
        memory_minus_query, bidirectional=not causal, num_buckets=8, max_distance=16
    )
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + hand_made[buckets].permute(2, 0, 1)
    if causal:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(got, scores.softmax(-1), atol=1e-5, rtol=1e-4)
    # Every row is read, the log-spaced ones too (an encoder's row 4, "distance +0", never is).
    assert len(set(buckets.flatten().tolist())) == (8 if causal else 7)


@pytest.mark.parametrize("model_type,head", [GPT2, BERT])
def test_zero_init_is_the_model_without_positions(model_type, head):
    stock = sharpen_qk(make_model(model_type, head))
    reference = copy.deepcopy(stock)
    sites = find_sites(reference)
    setattr(sites.owner, sites.arch.table, NoPositions(32))  # by hand: the table gone, no bias anywhere
    model = posswap.patch(stock, posswap.T5BiasConfig(max_length=NEW_LENGTH))
    assert all(torch.equal(t, torch.zeros_like(t)) for t in tables(model))
    ids = token_ids(30)
    with torch.no_grad():
        torch.testing.assert_close(outputs(model, ids), outputs(reference, ids), atol=1e-6, rtol=0)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gpt2_is_shift_invariant(backend):
    model = fill_tables(patched(*GPT2, backend=backend))
    ids, positions = token_ids(20), torch.arange(20).expand(2, -1)
    with torch.no_grad():
        base = model(ids, position_ids=positions).logits
        torch.testing.assert_close(model(ids, position_ids=positions + 37).logits, base, atol=1e-5, rtol=0)
        jumped = torch.cat([torch.arange(10), torch.arange(10) + 30]).expand(2, -1)  # the buckets do matter
        assert (model(ids, position_ids=jumped).logits - base).abs().max() > 1e-3


@pytest.mark.parametrize("per_layer,count", [(False, 1), (True, 2)])
def test_shared_or_one_table_per_layer(per_layer, count):
    model = patched(*BERT, per_layer=per_layer, num_buckets=16)
    keys = [k for k in model.state_dict() if "posswap_bias_providers" in k]
    assert keys == [f"bert.posswap_bias_providers.{i}.relative_attention_bias.weight" for i in range(count)]
    assert all(t.shape == (16, 4) for t in tables(model))
    providers = [a.posswap_bias for a in find_sites(model).self_attentions()]
    assert (providers[0] is providers[1]) == (not per_layer)


def independent_bucket_means(stock, num_buckets, max_distance):
    """The fit, computed apart from posswap: the table through the linear part of the first LayerNorm (typical std
    of its whole input over every token and position, brute force), the first layer's q/k weights, pair by pair."""
    sites = find_sites(stock)
    rows = sites.table.weight[sites.offset : sites.offset + 32].double()
    words = stock.get_input_embeddings().weight.double()
    if stock.config.model_type == "gpt2":
        norm, attention = stock.transformer.h[0].ln_1, stock.transformer.h[0].attn
        w_q, w_k = attention.c_attn.weight.double()[:, :32], attention.c_attn.weight.double()[:, 32:64]
    else:
        words = words + stock.base_model.embeddings.token_type_embeddings.weight[0].double()
        norm, attention = stock.base_model.embeddings.LayerNorm, stock.base_model.encoder.layer[0].attention.self
        w_q, w_k = attention.query.weight.double().T, attention.key.weight.double().T
    every_input = words[:, None, :] + rows[None, :, :]  # (vocab, positions, dim)
    sigma = (every_input.var(-1, unbiased=False).mean() + norm.eps).sqrt()
    x = (rows - rows.mean(-1, keepdim=True)) / sigma * norm.weight.double()
    projection = getattr(stock.base_model, "embeddings_project", None)
    if projection is not None:
        x = x @ projection.weight.double().T
    q, k = (x @ w_q).view(32, 4, -1), (x @ w_k).view(32, 4, -1)
    causal = stock.config.model_type == "gpt2"
    sums, counts = torch.zeros(num_buckets, 4, dtype=torch.double), torch.zeros(num_buckets)
    for i in range(32):
        for j in range(i + 1 if causal else 32):
            b = int(T5Attention._relative_position_bucket(torch.tensor(j - i), not causal, num_buckets, max_distance))
            sums[b] += (q[i] * k[j]).sum(-1) / math.sqrt(q.shape[-1])
            counts[b] += 1
    return sums / counts.clamp_min(1)[:, None], counts


@pytest.mark.parametrize(
    "model_type,head", [GPT2, BERT, ("roberta", "RobertaForMaskedLM"), ("electra", "ElectraForPreTraining")]
)
def test_fit_init_is_the_per_bucket_mean_of_first_layer_position_logits(model_type, head):
    stock = sinusoid_table(sharpen_qk(make_model(model_type, head)))
    with torch.no_grad():
        expected, counts = independent_bucket_means(stock, 16, 200)  # 32 positions never reach the last buckets
    model = posswap.patch(
        stock, posswap.T5BiasConfig(max_length=NEW_LENGTH, num_buckets=16, max_distance=200, init="fit", per_layer=True)
    )
    assert (counts == 0).any() and (expected[counts == 0] == 0).all() and (expected[counts > 0] != 0).all()
    for table in tables(model):  # every layer starts from the first layer's fit
        torch.testing.assert_close(table.double(), expected, atol=1e-9, rtol=1e-5)


@pytest.mark.parametrize("model_type,head", [GPT2, BERT])
def test_fit_brings_the_first_layer_closer_to_the_original(model_type, head):
    """A first layer that reads positions by a relative kernel (q and k projections one scaled orthogonal matrix):
    the fit puts its attention much nearer the original's than zeros do."""
    stock = sinusoid_table(sharpen_qk(make_model(model_type, head)))
    stock.set_attn_implementation("eager")
    orthogonal = torch.linalg.qr(torch.randn(32, 32, generator=torch.Generator().manual_seed(5)))[0] * 3
    attention = find_sites(stock).self_attentions()[0]
    with torch.no_grad():
        if model_type == "gpt2":
            attention.c_attn.weight[:, :64] = orthogonal.repeat(1, 2)
        else:
            attention.query.weight.copy_(orthogonal)
            attention.key.weight.copy_(orthogonal)
    ids = token_ids(32, batch=4)
    with torch.no_grad():
        original = stock(ids, output_attentions=True).attentions[0]
        error = {}
        for init in ("zeros", "fit"):
            model = posswap.patch(copy.deepcopy(stock), posswap.T5BiasConfig(max_length=NEW_LENGTH, init=init))
            error[init] = (model(ids, output_attentions=True).attentions[0] - original).abs().mean()
    assert error["fit"] < 0.8 * error["zeros"], error


@pytest.mark.parametrize("model_type,head", [GPT2, BERT])
def test_kernels_agree(model_type, head):
    def build(backend):
        model = fill_tables(patched(model_type, head, backend=backend, per_layer=True))
        assert model.config._attn_implementation == BIAS_IMPLEMENTATIONS[backend]
        return model

    assert_kernels_agree(model_type, build)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gpt2_kv_cache_decoding_equals_full_pass(backend):
    model = fill_tables(patched(*GPT2, backend=backend))
    assert_decoding_equals_full_pass(model, token_ids(40, batch=1), 5)  # past max_distance's log buckets


@pytest.mark.parametrize("per_layer,absolute", [(False, "drop"), (True, "keep")])
@pytest.mark.parametrize("model_type,head", [GPT2, BERT, ("roberta", "RobertaForMaskedLM")])
def test_save_and_load_restore_the_bucket_tables(model_type, head, per_layer, absolute, tmp_path):
    model = fill_tables(patched(model_type, head, per_layer=per_layer, absolute=absolute, backend="eager"))
    loaded = reload_and_compare(model, tmp_path, NEW_LENGTH)
    assert all(torch.equal(a, b) and a.abs().max() > 0 for a, b in zip(tables(loaded), tables(model), strict=True))
    assert (
        loaded.config.posswap["method"] == "t5-bias"
        and loaded.config._attn_implementation == BIAS_IMPLEMENTATIONS["eager"]
    )
    assert (find_sites(loaded).table is None) == (absolute == "drop")


def test_a_failure_inside_patch_leaves_the_model_untouched(monkeypatch):
    model = sinusoid_table(sharpen_qk(make_model(*GPT2)))
    ids = token_ids(20)
    with torch.no_grad():
        expected = model(ids).logits
    before, modules = snapshot(model), dict(model.transformer.named_children())

    def refuse(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)  # after the table is dropped, before initialize
    with pytest.raises(RuntimeError, match="injected failure"):
        posswap.patch(model, posswap.T5BiasConfig(max_length=NEW_LENGTH, init="fit", per_layer=True))
    assert_untouched(model, before)
    assert dict(model.transformer.named_children()) == modules and not hasattr(model.config, "posswap")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected)


def test_fit_without_a_table_is_refused_and_model_untouched():
    model = patched(*GPT2)
    before = snapshot(model)
    with pytest.raises(ValueError, match="init='fit' fits the biases to the learned position table"):
        posswap.patch(model, posswap.T5BiasConfig(max_length=NEW_LENGTH, init="fit"))
    assert_untouched(model, before)


def test_trainable_positions_are_the_bucket_tables():
    model = patched(*GPT2, per_layer=True).train()
    select_trainable(model, "positions", train_norms=False)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        f"transformer.posswap_bias_providers.{i}.relative_attention_bias.weight" for i in range(2)
    ]
    ids = token_ids(NEW_LENGTH)
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(t.grad is not None and t.grad.abs().max() > 0 for t in tables(model))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_buckets=3), "num_buckets must be an integer >= 4"),
        (dict(num_buckets=32.0), "num_buckets must be an integer"),
        (dict(max_distance=16), "max_distance must be an integer > 16"),
        (dict(max_distance=float("nan")), "max_distance must be an integer"),
        (dict(per_layer="yes"), "per_layer must be true or false"),
        (dict(init="random"), "init must be one of 'zeros', 'fit'"),
        (dict(absolute="freeze"), "absolute must be one of 'drop', 'keep'"),
        (dict(backend="flash"), "backend must be one of 'sdpa', 'flex', 'eager'"),
    ],
)
def test_bad_config_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        posswap.T5BiasConfig(max_length=NEW_LENGTH, **kwargs)


def test_config_from_dict_and_defaults():
    config = posswap.config_from_dict({"method": "t5-bias", "max_length": 128, "per_layer": True})
    assert isinstance(config, posswap.T5BiasConfig) and config.method == "t5-bias"
    assert (config.num_buckets, config.max_distance, config.absolute, config.init, config.backend) == (
        32,
        128,
        "drop",
        "zeros",
        None,
    )
