"""train.distill: the unpatched model as teacher keeps the trained model closer to it on its own windows; weight 0
is the plain run exactly; bad values are one line naming the key, before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file

import posswap
from posswap.cli import main
from posswap.data import read_document
from posswap.training import recipe_from_dict, train

OLD_LENGTH = 32  # the bases' table (conftest's bases)


@pytest.fixture(scope="module")
def sharp(bases, tmp_path_factory) -> Path:
    """conftest's tiny bases with a sharper output (the last LayerNorm's gain x 10), so that the original predicts
    something a run can forget (a random tiny model's outputs are nearly uniform), and a short training text."""
    root = tmp_path_factory.mktemp("sharp")
    (root / "text.txt").write_text(read_document("emma")[:40_000])
    for arch, head, norm in (("gpt2", HEADS["gpt2"], "transformer.ln_f"), ("bert", HEADS["bert"], NORM_BERT)):
        model = head.from_pretrained(bases / arch)
        with torch.no_grad():
            model.get_submodule(norm).weight *= 10
        model.save_pretrained(root / arch)
        transformers.AutoTokenizer.from_pretrained(bases / arch).save_pretrained(root / arch)
    return root


HEADS = {"gpt2": transformers.AutoModelForCausalLM, "bert": transformers.AutoModelForMaskedLM}
NORM_BERT = "cls.predictions.transform.LayerNorm"


def make_raw(bases: Path, out: Path, arch: str, method: str, distill: dict | None = None, **changes) -> dict:
    raw = {
        "model": str(bases / arch),
        "posswap": {"method": method, "max_length": 2 * OLD_LENGTH},
        "data": {"train": str(bases / "text.txt")},
        "train": {"output_dir": str(out), "max_steps": 4, "batch_size": 2, "lr": 5e-3, "save_every": 100},
    }
    raw["train"].update(changes)
    if distill is not None:
        raw["train"]["distill"] = distill
    return raw


def run(raw: dict) -> Path:
    return train(recipe_from_dict(raw), raw)


def heldout_kl(original, trained, tokenizer, causal: bool) -> float:
    """KL(original || trained) per token on held-out text (after the training text), in windows of the original's
    length; for an MLM with every 7th token masked, at the masked tokens. Computed here by hand, not by the loop."""
    text = read_document("emma")[330_000:336_000]
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    windows = torch.tensor(ids[: len(ids) // OLD_LENGTH * OLD_LENGTH]).view(-1, OLD_LENGTH)[:16]
    where = torch.ones_like(windows, dtype=torch.bool)
    if not causal:
        where = (torch.arange(OLD_LENGTH) % 7 == 3).expand_as(windows)
        windows = windows.masked_fill(where, tokenizer.mask_token_id)
    with torch.no_grad():
        p = torch.log_softmax(original(input_ids=windows).logits.double(), -1)[where]
        q = torch.log_softmax(trained(input_ids=windows).logits.double(), -1)[where]
    return (p.exp() * (p - q)).sum(-1).mean().item()


@pytest.mark.parametrize("arch,method", [("gpt2", "rope"), ("bert", "alibi")])
def test_distillation_keeps_the_trained_model_closer_to_the_original(sharp, tmp_path, arch, method):
    plain = run(make_raw(sharp, tmp_path / "plain", arch, method))
    distilled = run(make_raw(sharp, tmp_path / "distilled", arch, method, {"weight": 1.0}, log_every=1))
    original = HEADS[arch].from_pretrained(sharp / arch).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(sharp / arch)
    kl = {
        name: heldout_kl(original, posswap.from_pretrained(str(folder)).eval(), tokenizer, arch == "gpt2")
        for name, folder in (("plain", plain), ("distilled", distilled))
    }
    print(f"{arch} {method}: held-out KL(original || trained) per token {kl}")
    assert kl["distilled"] < 0.8 * kl["plain"], kl
    lines = [json.loads(line) for line in (tmp_path / "distilled" / "log.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(line["distill_kl"] > 0 and 0 < line["teacher_share"] < 1 for line in lines)
    assert lines[0]["teacher_mb"] > 0
    assert "distill" not in (tmp_path / "plain" / "log.jsonl").read_text()


@pytest.fixture(scope="module")
def sharp_maps(sharp, tmp_path_factory) -> Path:
    """``sharp``'s GPT-2 with q and k x 4 in every layer: attention that picks positions (a random tiny model's is
    nearly uniform, and every map would be close to every other)."""
    root = tmp_path_factory.mktemp("sharp-maps")
    (root / "text.txt").write_text((sharp / "text.txt").read_text())
    model = HEADS["gpt2"].from_pretrained(sharp / "gpt2")
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[:, : 2 * model.config.n_embd] *= 8
    model.save_pretrained(root / "gpt2")
    transformers.AutoTokenizer.from_pretrained(sharp / "gpt2").save_pretrained(root / "gpt2")
    return root


def heldout_map_kl(original, trained, tokenizer) -> list[float]:
    """Per layer, KL(original's row || trained's row) per query on held-out windows of the original's length,
    both models in eager attention: by hand, not by the loop."""
    ids = tokenizer(read_document("emma")[330_000:334_000], add_special_tokens=False)["input_ids"]
    windows = torch.tensor(ids[: 8 * OLD_LENGTH]).view(8, OLD_LENGTH)
    with torch.no_grad():
        p = original(input_ids=windows, output_attentions=True).attentions
        q = trained(input_ids=windows, output_attentions=True).attentions
    return [
        (a.double() * (a.double().clamp_min(1e-30).log() - b.double().clamp_min(1e-30).log())).sum(-1).mean().item()
        for a, b in zip(p, q, strict=True)
    ]


def test_attention_layers_keep_the_maps_closer_to_the_original(sharp_maps, tmp_path):
    """RoPE drops the table the maps were built on: with the maps in the loss they stay nearer the original's than
    with the logits alone, on held-out text within the original's length."""
    logits = run(make_raw(sharp_maps, tmp_path / "logits", "gpt2", "rope", {"weight": 1.0}, max_steps=12))
    maps = run(
        make_raw(
            sharp_maps, tmp_path / "maps", "gpt2", "rope", {"weight": 1.0, "attention_layers": [0, 1]}, max_steps=12
        )
    )
    original = HEADS["gpt2"].from_pretrained(sharp_maps / "gpt2", attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(sharp_maps / "gpt2")
    kl = {
        name: heldout_map_kl(
            original, posswap.from_pretrained(str(folder), attn_implementation="eager").eval(), tokenizer
        )
        for name, folder in (("logits", logits), ("maps", maps))
    }
    print(f"held-out attention KL per layer {kl}")
    assert all(m < 0.8 * lo for m, lo in zip(kl["maps"], kl["logits"], strict=True)), kl
    lines = [json.loads(line) for line in (tmp_path / "maps" / "log.jsonl").read_text().splitlines()]
    assert all(line["distill_attention_kl"] > 0 for line in lines)
    assert "distill_attention_kl" not in (tmp_path / "logits" / "log.jsonl").read_text()
    # The student runs in its own kernel again after each eager pass.
    assert posswap.from_pretrained(str(maps)).config._attn_implementation != "eager"


def test_weight_zero_is_the_plain_run_exactly(sharp, tmp_path, monkeypatch):
    loads = []
    monkeypatch.setattr("posswap.training.distill.load_teacher", lambda *args: loads.append(args))
    plain = run(make_raw(sharp, tmp_path / "plain", "gpt2", "rope", max_steps=3))
    zero = run(make_raw(sharp, tmp_path / "zero", "gpt2", "rope", {"weight": 0, "temperature": 2.0}, max_steps=3))
    a, b = load_file(plain / "model.safetensors"), load_file(zero / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert loads == []  # no teacher was loaded
    assert (tmp_path / "plain" / "log.jsonl").read_text().count("distill") == 0


@pytest.mark.parametrize(
    "distill,message",
    [
        ({"weight": -1}, "train.distill.weight must be a number >= 0, got -1."),
        ({"weight": "a"}, "train.distill.weight must be a number >= 0, got 'a'."),
        ({"weight": float("nan")}, "train.distill.weight must be a finite number >= 0, got nan."),
        ({"weight": 1, "temperature": 0}, "train.distill.temperature must be a number > 0, got 0."),
        (
            {"weight": 1, "temprature": 2},
            "Unknown key(s) in train.distill: temprature (did you mean temperature?). Known keys: weight, temperature, "
            "attention_layers.",
        ),
        (3, "train.distill must be a mapping, got int."),
        ({"weight": 1, "attention_layers": 0}, "train.distill.attention_layers must be a list of layer numbers >= 0"),
        ({"weight": 1, "attention_layers": [0, -1]}, "train.distill.attention_layers must be a list of layer numbers"),
        ({"weight": 1, "attention_layers": [True]}, "train.distill.attention_layers must be a list of layer numbers"),
        ({"weight": 1, "attention_layers": [1, 1]}, "train.distill.attention_layers names a layer twice: [1, 1]."),
        ({"weight": 1, "attention_layers": [2]}, "train.distill.attention_layers: 2 is not a layer of"),
    ],
)
def test_bad_values_are_one_line_naming_the_key_before_any_work(sharp, tmp_path, capsys, distill, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(make_raw(sharp, tmp_path / "run", "gpt2", "rope", distill)))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_an_embedding_recipe_is_pointed_at_embedding_teacher():
    raw = {
        "model": "posswap:minilm",
        "posswap": {"method": "interpolate", "max_length": 1024},
        "embedding": {"document_lengths": [512]},
        "train": {"batch_size": 2, "distill": {"weight": 1.0}},
    }
    with pytest.raises(ValueError, match=r"^train\.distill is for the MLM/CLM loop.*embedding\.teacher"):
        recipe_from_dict(raw)
