"""posswap.study.pictures: position maps, attention against distance and T5 buckets, each checked against an
independent computation from the weights or the papers' formulas."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import make_model, sharpen_qk, token_ids
from test_common import FACTORIES

import posswap
from posswap.portable.posswap_t5 import t5_buckets
from posswap.study import pictures

LENGTH = 48  # positions the patched tiny models read (the stock ones read 32)
SHOWN = 20  # positions drawn in the maps
HEADS = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}
METHODS = ["learned", *FACTORIES]


def build(method: str, model_type: str, config=None):
    model = sharpen_qk(make_model(model_type, HEADS[model_type]))
    if method != "learned":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # NoPE on an encoder warns (tested elsewhere)
            model = posswap.patch(model, config or FACTORIES[method](LENGTH))
    return model.eval()


@pytest.fixture(scope="module")
def models():
    """Every method on every architecture, built once (models are only read here)."""
    return {(m, t): build(m, t) for m in METHODS for t in HEADS}


def lower(matrix: torch.Tensor) -> torch.Tensor:
    return matrix.tril()


@pytest.mark.parametrize("model_type", HEADS)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_gives_its_kind_of_map(models, method, model_type):
    result = pictures.position_similarity(models[method, model_type], SHOWN)
    if method == "nope":
        assert result is None
        return
    matrix, description = result
    assert matrix.shape == (SHOWN, SHOWN) and matrix.dtype == torch.float32 and description
    causal_term = model_type == "gpt2" and method in ("alibi", "t5-bias", "tupe")
    if causal_term:  # a logit term: what the causal mask hides is NaN
        future = torch.ones(SHOWN, SHOWN, dtype=torch.bool).triu(1)
        assert torch.isnan(matrix[future]).all() and torch.isfinite(matrix[~future]).all()
    else:
        assert torch.isfinite(matrix).all()
    if method in ("learned", "interpolate", "sinusoidal", "rope") or (method == "alibi" and not causal_term):
        torch.testing.assert_close(matrix, matrix.t())
    if method in ("learned", "interpolate", "sinusoidal", "rope"):  # cosines: 1 on the diagonal
        torch.testing.assert_close(matrix.diagonal(), torch.ones(SHOWN))


def test_a_step_picks_every_step_th_position(models):
    full, _ = pictures.position_similarity(models["alibi", "bert"], SHOWN)
    thinned, _ = pictures.position_similarity(models["alibi", "bert"], SHOWN, step=3)
    torch.testing.assert_close(thinned, full[::3, ::3])


def test_longer_than_the_model_reads_is_a_clear_error(models):
    with pytest.raises(ValueError, match="1..32"):
        pictures.position_similarity(models["learned", "gpt2"], 33)


def cosine(rows: torch.Tensor) -> torch.Tensor:
    rows = rows.double()
    norms = rows.norm(dim=-1)
    return (rows @ rows.t() / (norms[:, None] * norms[None, :])).float()


@pytest.mark.parametrize("method", ["learned", "interpolate"])
@pytest.mark.parametrize("model_type", ["gpt2", "roberta"])
def test_learned_map_is_the_cosine_of_the_real_positions_rows(models, method, model_type):
    model = models[method, model_type]
    offset = 2 if model_type == "roberta" else 0  # RoBERTa: padding_idx + 1 rows before position 0
    weight = (model.transformer.wpe if model_type == "gpt2" else model.roberta.embeddings.position_embeddings).weight
    expected = cosine(weight.detach()[offset : offset + SHOWN])
    torch.testing.assert_close(pictures.position_similarity(model, SHOWN)[0], expected)


@pytest.mark.parametrize("model_type", ["gpt2", "roberta"])
def test_sinusoidal_map_is_the_cosine_of_the_formula_table(models, model_type):
    dim = 32
    p = torch.arange(SHOWN, dtype=torch.float64)[:, None]
    angle = p / 10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    table = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # sin on even dims, cos on odd
    torch.testing.assert_close(pictures.position_similarity(models["sinusoidal", model_type], SHOWN)[0], cosine(table))


def rotary_formula(head_dim: int, rotated: int, base: float = 10000.0, factor: float = 1.0) -> torch.Tensor:
    """mean over the head's dim pairs of cos((i - j) theta_k); pairs left unrotated count cos(0) = 1."""
    theta = base ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated) / factor
    d = torch.arange(SHOWN, dtype=torch.float64)
    d = d[:, None] - d[None, :]
    cosines = torch.cos(d[..., None] * theta).sum(-1)
    return ((cosines + (head_dim - rotated) / 2) / (head_dim / 2)).float()


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
@pytest.mark.parametrize(
    "options,rotated,factor",
    [({}, 8, 1.0), ({"rotary_dim": 0.5}, 4, 1.0), ({"rope_type": "linear", "factor": 4.0}, 8, 4.0)],
    ids=["full", "partial", "linear-scaled"],
)
def test_rotary_map_is_the_cos_formula(model_type, options, rotated, factor):
    model = build("rope", model_type, posswap.RopeConfig(max_length=LENGTH, **options))
    matrix, description = pictures.position_similarity(model, SHOWN)
    torch.testing.assert_close(matrix, rotary_formula(8, rotated, factor=factor))  # head dim 32 / 4 heads
    assert f"{rotated}/8" in description


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_alibi_map_is_minus_the_mean_slope_times_distance(models, model_type):
    heads = 4
    slopes = torch.tensor([2 ** (-8 * h / heads) for h in range(1, heads + 1)])  # the paper's 2^(-8h/n)
    d = torch.arange(SHOWN)
    expected = -slopes.mean() * (d[:, None] - d[None, :]).abs().float()
    matrix, description = pictures.position_similarity(models["alibi", model_type], SHOWN)
    assert "bias" in description
    if model_type == "gpt2":
        matrix, expected = lower(matrix.nan_to_num()), lower(expected)
    torch.testing.assert_close(matrix, expected)


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_t5_map_is_the_bucket_table_looked_up_by_distance(models, model_type):
    model = models["t5-bias", model_type]
    provider = model.base_model.posswap_bias_providers[0]
    table = provider.relative_attention_bias.weight.detach()  # (buckets, heads)
    i = torch.arange(SHOWN)
    relative = i[None, :] - i[:, None]  # key minus query, as T5
    buckets = t5_buckets(relative, model_type != "gpt2", provider.num_buckets, provider.max_distance)
    expected = table[buckets].mean(-1)
    matrix, _ = pictures.position_similarity(model, SHOWN)
    if model_type == "gpt2":
        matrix, expected = lower(matrix.nan_to_num()), lower(expected)
    torch.testing.assert_close(matrix, expected)


def test_tupe_map_is_the_untied_correlation_from_its_parameters(models):
    model = models["tupe", "gpt2"]  # GPT-2: no [CLS] reset
    provider = model.base_model.posswap_bias_providers[0]
    rows = provider.positions.detach()[:SHOWN].double()
    q = (rows @ provider.query.detach().double()).view(SHOWN, 4, 8)
    k = (rows @ provider.key.detach().double()).view(SHOWN, 4, 8)
    expected = (torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(2 * 8)).mean(0).float()
    matrix, _ = pictures.position_similarity(model, SHOWN)
    torch.testing.assert_close(lower(matrix.nan_to_num()), lower(expected))


def by_distance_by_hand(weights: torch.Tensor, causal: bool) -> torch.Tensor:
    """(heads, n, n) -> mean weight per distance, diagonal by diagonal."""
    mean = weights.double().mean(0)
    n = mean.shape[0]
    curve = []
    for d in range(n):
        values = mean.diagonal(-d) if causal or d == 0 else torch.cat([mean.diagonal(-d), mean.diagonal(d)])
        curve.append(values.mean())
    return torch.stack(curve).float()


def test_attention_by_distance_equals_the_hand_computation():
    model = build("learned", "gpt2")  # stock GPT-2 on sdpa
    ids = token_ids(24, batch=1)[0]
    kernel = model.config._attn_implementation
    curves = pictures.attention_by_distance(model, ids)
    assert curves.shape == (2, 24) and model.config._attn_implementation == kernel
    with torch.no_grad():  # layer 0 from the weights: softmax(q k^T / sqrt(d) + causal mask)
        hidden = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(24))
        attention = model.transformer.h[0].attn
        q, k, _ = attention.c_attn(model.transformer.h[0].ln_1(hidden)).split(32, dim=-1)
        q, k = (x.view(24, 4, 8).transpose(0, 1) for x in (q, k))
        scores = q @ k.transpose(1, 2) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(24, 24, dtype=torch.bool).triu(1), float("-inf"))
        expected = by_distance_by_hand(scores.softmax(-1), causal=True)
    torch.testing.assert_close(curves[0], expected)
    assert curves[0, 0] > curves[0, 10]  # sharpened q.k: not uniform
    short = pictures.attention_by_distance(model, ids, max_distance=5)
    torch.testing.assert_close(short, curves[:, :6])


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
@pytest.mark.parametrize("method", ["learned", "rope", "alibi", "tupe"])
def test_attention_by_distance_reads_the_models_own_weights(models, method, model_type):
    model = models[method, model_type]
    ids = token_ids(30, batch=1)[0]
    kernel = model.config._attn_implementation
    model.train()
    curves = pictures.attention_by_distance(model, ids)
    assert model.training and model.config._attn_implementation == kernel  # both put back
    model.eval()
    model.set_attn_implementation(pictures.eager_kernel(kernel))
    try:
        with torch.no_grad():
            attentions = model(input_ids=ids[None], output_attentions=True).attentions
    finally:
        model.set_attn_implementation(kernel)
    expected = torch.stack([by_distance_by_hand(a[0], causal=model_type == "gpt2") for a in attentions])
    torch.testing.assert_close(curves, expected)


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
@pytest.mark.parametrize("per_layer", [False, True])
def test_t5_bias_by_distance_is_the_bucket_table(model_type, per_layer, tmp_path):
    model = build("t5-bias", model_type, posswap.T5BiasConfig(max_length=LENGTH, init="fit", per_layer=per_layer))
    provider = model.base_model.posswap_bias_providers[0]  # the first layer's
    distances, bias = pictures.t5_bias_by_distance(model, 40)
    causal = model_type == "gpt2"
    assert distances[0] == (0 if causal else -40) and distances[-1] == 40 and bias.shape == (4, len(distances))
    for distance in (0, 1, 7, 40) + (() if causal else (-3, -40)):
        bucket = t5_buckets(torch.tensor(-distance), not causal, provider.num_buckets, provider.max_distance)
        column = bias[:, (distances == distance).nonzero().item()]
        torch.testing.assert_close(column, provider.relative_attention_bias.weight.detach()[bucket])
        i, j = (distance, 0) if distance >= 0 else (0, -distance)  # the dense bias the kernel adds agrees
        q, k = torch.tensor([[i]]), torch.tensor([[j]])
        torch.testing.assert_close(column, provider.bias(q, k)[0, :, 0, 0].detach())
    assert pictures.plot_t5_buckets(model, tmp_path / "t5.png", 40).stat().st_size > 0


def test_t5_buckets_of_a_model_without_them_is_a_clear_error(models, tmp_path):
    with pytest.raises(ValueError, match="no T5 bucket bias"):
        pictures.plot_t5_buckets(models["alibi", "gpt2"], tmp_path / "t5.png", 10)
    assert (
        pictures.t5_provider(models["tupe", "gpt2"])
        is models["tupe", "gpt2"].base_model.posswap_bias_providers[0].relative
    )


@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_plots_write_pngs_for_every_method(models, model_type, tmp_path):
    chosen = {method: models[method, model_type] for method in METHODS}
    path = pictures.plot_position_maps(chosen, 40, tmp_path / "maps.png")  # stock models: their 32 positions
    assert path.read_bytes()[:4] == b"\x89PNG"
    ids = token_ids(16, batch=1)[0]
    curves = {method: pictures.attention_by_distance(model, ids) for method, model in chosen.items()}
    for layer in ("mean", "both", 1):
        path = pictures.plot_attention_by_distance(curves, tmp_path / f"attention_{layer}.png", layer=layer)
        assert path.read_bytes()[:4] == b"\x89PNG"
