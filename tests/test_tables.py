"""``sinusoidal`` (the fixed sin/cos table) and ``nope`` (no positions): the table against the formula, the
RMS match, permutation equivariance, and one common body over (method x model) for the KV cache, left padding,
explicit positions, save / load, refused and failed patches, too-long inputs; the CLI, a recipe, the real MiniLM."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from conftest import OLD_LENGTH, assert_untouched, make_model, sharpen_qk, snapshot, token_ids

import posswap
from posswap import cli
from posswap.portable import posswap_runtime
from posswap.training import recipe_from_dict, train
from posswap.training.trainable import select_trainable

NEW_LENGTH = 96
METHODS = {"sinusoidal": posswap.SinusoidalConfig, "nope": posswap.NopeConfig}
MODELS = [("gpt2", "GPT2LMHeadModel"), ("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM")]


def patched(model_type: str, head: str, method: str, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NoPE on an encoder warns; tested on its own below
        return posswap.patch(
            sharpen_qk(make_model(model_type, head)), METHODS[method](max_length=NEW_LENGTH, **options)
        ).eval()


def table_slot(model):
    return (
        model.transformer.wpe if model.config.model_type == "gpt2" else model.base_model.embeddings.position_embeddings
    )


def textbook_sinusoid(position: int, dim: int, base: float) -> list[float]:
    """Vaswani et al.: PE(p, 2i) = sin(p / base^(2i/d)), PE(p, 2i+1) = cos(p / base^(2i/d))."""
    row = []
    for j in range(dim):
        angle = position / base ** (2 * (j // 2) / dim)
        row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
    return row


@pytest.mark.parametrize(
    "model_type,head,base", [("gpt2", "GPT2LMHeadModel", 10000.0), ("roberta", "RobertaForMaskedLM", 100.0)]
)
def test_sinusoidal_table_equals_the_formula(model_type, head, base):
    model = patched(model_type, head, "sinusoidal", scale=1.0, theta=base)
    offset = 2 if model_type == "roberta" else 0  # RoBERTa: row p is position p - 2; rows 0 and 1 are padding
    rows = table_slot(model)(torch.arange(NEW_LENGTH + offset)[None])[0]
    expected = torch.tensor([textbook_sinusoid(max(p - offset, 0), 32, base) for p in range(NEW_LENGTH + offset)])
    torch.testing.assert_close(rows, expected, atol=1e-6, rtol=0)
    odd = posswap.portable.posswap_functional.sinusoidal_table(50, 7, base)  # an odd width ends on a sin column
    torch.testing.assert_close(odd, torch.tensor([textbook_sinusoid(p, 7, base) for p in range(50)]), atol=1e-6, rtol=0)


@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("roberta", "RobertaForMaskedLM")])
def test_scale_match_gives_the_learned_tables_rms(model_type, head):
    model = make_model(model_type, head)
    offset = 2 if model_type == "roberta" else 0
    learned = table_slot(model).weight.detach()[offset:]  # real positions only
    with torch.no_grad():  # a table far from the sinusoid's own RMS (0.707), so a missing scale shows
        learned.mul_(3.0)
    posswap.patch(model, posswap.SinusoidalConfig(max_length=NEW_LENGTH))
    rows = table_slot(model)(torch.arange(offset, offset + OLD_LENGTH)[None])
    rms = lambda t: t.double().pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(rows) == pytest.approx(rms(learned), rel=1e-5)
    assert isinstance(model.config.posswap["scale"], float)  # recorded, so a saved model needs no table


def test_nope_bert_is_permutation_equivariant_and_sinusoidal_bert_is_not():
    ids = token_ids(24, batch=1)
    order = torch.randperm(24, generator=torch.Generator().manual_seed(0))
    for method, equivariant in (("nope", True), ("sinusoidal", False)):
        model = patched("bert", "BertModel", method)
        with torch.no_grad():
            straight, shuffled = model(ids).last_hidden_state, model(ids[:, order]).last_hidden_state
        if equivariant:
            torch.testing.assert_close(shuffled, straight[:, order], atol=1e-5, rtol=1e-5)
        else:
            assert (shuffled - straight[:, order]).abs().max() > 1e-2


def test_nope_warns_on_encoders_only():
    with pytest.warns(UserWarning, match="permutation-equivariant"):
        posswap.patch(make_model("bert", "BertModel"), posswap.NopeConfig(max_length=NEW_LENGTH))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), posswap.NopeConfig(max_length=NEW_LENGTH))


def test_tables_stay_fixed_when_training_everything():
    for method in METHODS:
        model = select_trainable(patched("gpt2", "GPT2LMHeadModel", method), "full", False)
        assert list(table_slot(model).parameters()) == []
        assert not any("wpe" in name for name, _ in model.named_parameters())
        with pytest.raises(ValueError, match="no position parameters"):
            select_trainable(model, "positions", False)


# ---- one common body over (method x model) -----------------------------------------------------------------

COMMON = [(method, model_type, head) for method in METHODS for model_type, head in MODELS]
COMMON_IDS = [f"{method}-{model_type}" for method, model_type, _ in COMMON]


@pytest.mark.parametrize("method,model_type,head", COMMON, ids=COMMON_IDS)
def test_explicit_position_ids_equal_implicit_ones(method, model_type, head):
    model = patched(model_type, head, method)
    ids = token_ids(40)
    offset = 2 if model_type == "roberta" else 0
    with torch.no_grad():
        implicit = model(ids).logits
        explicit = model(ids, position_ids=torch.arange(offset, offset + 40)[None].expand(2, -1)).logits
        shifted = model(ids, position_ids=torch.arange(offset + 30, offset + 70)[None].expand(2, -1)).logits
    torch.testing.assert_close(explicit, implicit)
    assert (shifted - implicit).abs().max() > 1e-3 if method == "sinusoidal" else torch.allclose(shifted, implicit)


@pytest.mark.parametrize("method,model_type,head", COMMON, ids=COMMON_IDS)
def test_refused_or_failed_patch_leaves_the_model_untouched(method, model_type, head, monkeypatch):
    extended = posswap.patch(make_model(model_type, head), posswap.InterpolateConfig(max_length=64))
    before = snapshot(extended)
    with pytest.raises(ValueError, match="already patched with 'interpolate'"):  # refused before any change
        posswap.patch(extended, METHODS[method](max_length=NEW_LENGTH))
    assert_untouched(extended, before)

    model = sharpen_qk(make_model(model_type, head))
    ids = token_ids(20)
    with torch.no_grad():
        expected = model(ids).logits
    before, config_class, table = snapshot(model), type(model.config), table_slot(model)

    def refuse(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(posswap_runtime, "install_length_guard", refuse)  # fails after the table was swapped
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="injected failure"):
        warnings.simplefilter("ignore")
        posswap.patch(model, METHODS[method](max_length=NEW_LENGTH))
    assert_untouched(model, before)
    assert table_slot(model) is table and type(model.config) is config_class and not hasattr(model.config, "posswap")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected)


def test_scale_match_without_a_table_is_refused_untouched():
    model = patched("gpt2", "GPT2LMHeadModel", "sinusoidal")
    before = snapshot(model)
    with pytest.raises(ValueError, match=r"scale=.match. measures the learned position table.*scale=[0-9.]+\)"):
        posswap.patch(model, posswap.SinusoidalConfig(max_length=2 * NEW_LENGTH))
    assert_untouched(model, before)
    posswap.patch(model, posswap.SinusoidalConfig(max_length=2 * NEW_LENGTH, scale=model.config.posswap["scale"]))
    model(token_ids(150, batch=1))


# ---- entry points: CLI, recipe, the real MiniLM ----------------------------------------------------------------


def test_cli_patches_with_both_methods(tmp_path):
    make_model("bert", "BertForMaskedLM").save_pretrained(tmp_path / "bert")
    for method, extra in (("sinusoidal", ["--scale", "0.5", "--theta", "500"]), ("nope", [])):
        out = tmp_path / method
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = cli.main(
                ["patch", str(tmp_path / "bert"), "--method", method, "--max-length", "64", "--out", str(out), *extra]
            )
        assert code == 0
        block = posswap.from_pretrained(str(out)).config.posswap
        assert block["method"] == method and block["max_length"] == 64
        if method == "sinusoidal":
            assert (block["scale"], block["theta"]) == (0.5, 500)


@pytest.mark.parametrize("arch,method", [("gpt2", "sinusoidal"), ("bert", "nope")])
def test_recipe_trains_and_loads(bases, tmp_path, arch, method):
    raw = {
        "model": str(bases / arch),
        "posswap": {"method": method, "max_length": 64},
        "data": {"train": str(bases / "text.txt")},
        "train": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "batch_size": 2,
            "lr": 3e-3,
            "save_every": 10,
            "log_every": 1,
        },
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        final = train(recipe_from_dict(raw), raw)
    model = posswap.from_pretrained(str(final))
    assert model.config.posswap["method"] == method and model.config.max_position_embeddings == 64
