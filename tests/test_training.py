"""posswap train: loss goes down, resume is exact, LoRA merges, `positions` trains only positions, PoSE and
curriculum, DDP on CPU, bad recipes write nothing."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import transformers
import transformers.modeling_utils
import yaml
from conftest import TEXT
from safetensors.torch import load_file

import posswap
from posswap.cli import main
from posswap.study.reference import RECIPE as REFERENCE_RECIPE
from posswap.training import recipe_from_dict, train
from posswap.training.objectives import pose_position_ids
from posswap.training.recipe import load_recipe


def make_raw(bases: Path, out: Path, arch: str = "gpt2", method: str = "rope", **train) -> dict:
    return {
        "model": str(bases / arch),
        "posswap": {"method": method, "max_length": 64},
        "data": {"train": str(bases / "text.txt")},
        "train": {
            "output_dir": str(out),
            "max_steps": 20,
            "batch_size": 2,
            "lr": 3e-3,
            "save_every": 10,
            "log_every": 1,
            **train,
        },
    }


def run(raw: dict, **kwargs) -> Path:
    return train(recipe_from_dict(raw), raw, **kwargs)


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("arch,method", [("gpt2", "rope"), ("bert", "alibi"), ("gpt2", "interpolate")])
def test_loss_goes_down_and_output_loads(bases, tmp_path, arch, method):
    final = run(make_raw(bases, tmp_path / "run", arch, method))
    curve = losses(tmp_path / "run")
    assert len(curve) == 20
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5
    model = posswap.from_pretrained(str(final))
    assert model.config.posswap["method"] == method
    assert model.config.posswap["max_length"] == 64
    assert transformers.AutoTokenizer.from_pretrained(final).model_max_length == 64
    # The trained folder carries its run time (RoPE/ALiBi) for loading without posswap; interpolate needs none.
    assert (final / "modeling_posswap.py").exists() == (method != "interpolate")


@pytest.mark.parametrize("method", ["t5-bias", "tupe"])
def test_gradient_checkpointing_run_equals_the_plain_run(bases, tmp_path, monkeypatch, method):
    """train.gradient_checkpointing: every layer recomputed in the backward (counted), the same losses as without
    (T5 bias and TUPE once crashed there), and no deprecation warning from transformers' enabling call."""
    calls = []
    original = transformers.modeling_utils.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.modeling_utils, "checkpoint", counting)
    plain = run(make_raw(bases, tmp_path / "plain", "gpt2", method, max_steps=3))
    assert not calls
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        run(make_raw(bases, tmp_path / "ckpt", "gpt2", method, max_steps=3, gradient_checkpointing=True))
    layers = posswap.from_pretrained(str(plain)).config.n_layer
    assert len(calls) >= 3 * layers  # each step, each layer
    torch.testing.assert_close(torch.tensor(losses(tmp_path / "ckpt")), torch.tensor(losses(tmp_path / "plain")))


class Interrupted(Exception):
    pass


def stop_at(step_to_stop: int):
    def callback(step: int, loss: float, model) -> None:
        if step == step_to_stop:
            raise Interrupted  # as if the process were killed right after checkpoint 10

    return callback


@pytest.mark.parametrize("arch,method", [("gpt2", "rope"), ("bert", "alibi")])
def test_resume_after_a_kill_gives_the_same_weights(bases, tmp_path, arch, method):
    straight = run(make_raw(bases, tmp_path / "straight", arch, method, grad_accum=2))
    raw = make_raw(bases, tmp_path / "resumed", arch, method, grad_accum=2)
    with pytest.raises(Interrupted):
        run(raw, callbacks=[stop_at(13)])  # three steps after checkpoint-10 are lost, as promised
    assert (tmp_path / "resumed" / "checkpoint-10").is_dir()
    assert not list((tmp_path / "resumed").glob("*.tmp"))
    resumed = run(raw, resume=True)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0)
    assert losses(tmp_path / "straight")[-1] == pytest.approx(losses(tmp_path / "resumed")[-1], abs=1e-5)


def test_causal_model_names_its_loss(bases, tmp_path):
    """Else transformers warns on the first step that loss_type=None is unrecognized (a line no user can act on)."""
    from posswap.training.loop import load_patched_model

    model, _, causal = load_patched_model(recipe_from_dict(make_raw(bases, tmp_path / "run")))
    assert causal and model.loss_type == "ForCausalLM"
    assert model.loss_function is transformers.loss.loss_utils.LOSS_MAPPING["ForCausalLM"]


def test_lora_run_merges_into_a_plain_model(bases, tmp_path):
    final = run(make_raw(bases, tmp_path / "run", "gpt2", "interpolate", trainable="lora", train_norms=True, lr=1e-2))
    weights = load_file(final / "model.safetensors")
    assert not any("lora" in key for key in weights)
    base = load_file(bases / "gpt2" / "model.safetensors")
    assert not torch.equal(
        weights["transformer.h.0.attn.c_attn.weight"], base["transformer.h.0.attn.c_attn.weight"]
    )  # LoRA merged
    assert weights["transformer.wpe.weight"].shape[0] == 64
    assert not torch.equal(weights["transformer.wpe.weight"][:32], base["transformer.wpe.weight"])  # table trained
    assert torch.equal(
        weights["transformer.h.0.mlp.c_fc.weight"], base["transformer.h.0.mlp.c_fc.weight"]
    )  # MLP frozen
    assert type(posswap.from_pretrained(str(final))).__name__ == "GPT2LMHeadModel"


def test_positions_run_changes_only_the_table(bases, tmp_path):
    final = run(make_raw(bases, tmp_path / "run", "gpt2", "interpolate", trainable="positions", max_steps=5))
    weights, base = load_file(final / "model.safetensors"), load_file(bases / "gpt2" / "model.safetensors")
    changed = {
        k for k in base if k in weights and (weights[k].shape != base[k].shape or not torch.equal(weights[k], base[k]))
    }
    assert changed == {"transformer.wpe.weight"}


def test_positions_without_a_table_needs_norms(bases, tmp_path):
    with pytest.raises(ValueError, match="no position parameters"):
        run(make_raw(bases, tmp_path / "run", "gpt2", "rope", trainable="positions"))
    final = run(
        make_raw(bases, tmp_path / "norms", "gpt2", "rope", trainable="positions", train_norms=True, max_steps=5)
    )
    weights, base = load_file(final / "model.safetensors"), load_file(bases / "gpt2" / "model.safetensors")
    changed = {k for k in weights if not torch.equal(weights[k], base[k])}
    assert changed and all(".ln_" in k for k in changed)


def test_head_run_trains_a_new_mlm_head_and_nothing_else(bases, tmp_path, capfd):
    """An encoder saved without an MLM head (as all-MiniLM-L6-v2): trainable 'head' trains the head's transform and
    bias; the encoder and the word embeddings (the tied decoder) stay as they are. The load says so in one line."""
    encoder = tmp_path / "encoder"
    transformers.BertModel.from_pretrained(bases / "bert").save_pretrained(encoder)
    transformers.AutoTokenizer.from_pretrained(bases / "bert").save_pretrained(encoder)
    raw = make_raw(bases, tmp_path / "run", "bert", trainable="head", max_steps=5)
    raw.update(model=str(encoder), posswap=None)
    capfd.readouterr()
    final = run(raw)
    err = capfd.readouterr().err
    assert "saved without this head (BertModel)" in err and "LOAD REPORT" not in err and "corrupted" not in err
    weights, base = load_file(final / "model.safetensors"), load_file(encoder / "model.safetensors")
    unchanged = lambda k: k.removeprefix("bert.") in base and torch.equal(weights[k], base[k.removeprefix("bert.")])  # noqa: E731
    changed = {k for k in weights if not unchanged(k)}
    assert changed and all(k.startswith("cls.predictions.") and "decoder" not in k for k in changed)
    with pytest.raises(ValueError, match="no parameters outside its base model"):
        run(make_raw(bases, tmp_path / "gpt2", "gpt2", method="interpolate", trainable="head", max_steps=1))


def test_pose_position_ids_span_the_target_length():
    torch.manual_seed(0)
    ids = pose_position_ids(64, window=16, max_length=128, offset=2)
    assert ids.shape == (64, 16)
    assert (ids[:, 0] == 2).all() and (ids < 128 + 2).all()
    assert ((ids[:, 1:] - ids[:, :-1]) >= 1).all()  # increasing, one jump
    assert ids[:, -1].max() > 64  # reaches far beyond the window


def test_pose_and_curriculum_runs(bases, tmp_path):
    run(make_raw(bases, tmp_path / "pose", "gpt2", "rope", pose_window=16, max_steps=6))
    run(make_raw(bases, tmp_path / "curriculum", "bert", "interpolate", curriculum=[32, 64], max_steps=6))
    lengths = [json.loads(line)["length"] for line in (tmp_path / "curriculum" / "log.jsonl").read_text().splitlines()]
    assert lengths == [32, 32, 32, 64, 64, 64]


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda r: r["train"].update(lerning_rate=1), "Unknown key.*train: lerning_rate"),
        (lambda r: r.update(optimiser={}), "Unknown key.*recipe: optimiser"),
        (lambda r: r.pop("model"), "needs model:"),
        (lambda r: r["posswap"].update(max_length=-5), "max_length must be a positive integer"),
        (lambda r: r["posswap"].update(max_length="4k"), "max_length must be a positive integer"),
        (lambda r: r["train"].update(trainable="half"), "train.trainable must be one of"),
        (lambda r: r["train"].update(pose_window=128), "pose_window"),
        (lambda r: r["train"].update(position_lr=0), "train.position_lr"),
    ],
)
def test_bad_recipe_is_refused_and_writes_nothing(bases, tmp_path, capsys, change, message):
    raw = make_raw(bases, tmp_path / "run")
    change(raw)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 2
    assert __import__("re").search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_missing_model_folder_writes_nothing(bases, tmp_path, capsys):
    raw = make_raw(bases, tmp_path / "run")
    raw["model"] = str(tmp_path / "no-such-model")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 2
    assert not (tmp_path / "run").exists()


def test_set_overrides_and_shipped_recipes_parse():
    recipes = sorted((Path(__file__).parents[1] / "recipes").glob("*.yaml")) + [REFERENCE_RECIPE]
    assert len(recipes) >= 7
    for path in recipes:
        patched = yaml.safe_load(path.read_text())["posswap"] is not None
        recipe, _ = load_recipe(path, ["train.max_steps=7"] + (["posswap.max_length=4096"] if patched else []))
        assert recipe.train.max_steps == 7
        assert recipe.max_length == (4096 if patched else None)
    with pytest.raises(ValueError, match="posswap.*not a block"):
        load_recipe(REFERENCE_RECIPE, ["posswap.max_length=4096"])


def test_run_ends_with_evaluation_and_a_push(bases, tmp_path, hub):
    raw = make_raw(bases, tmp_path / "run", "gpt2", "rope", max_steps=4)
    raw["eval"] = {"lengths": [32, 64], "data": str(bases / "text.txt"), "max_tokens": 128}
    raw["push_to_hub"] = "me/tiny-gpt2-rope-64"
    run(raw)
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    assert set(results["models"]) == {"original", "trained"}
    files = hub.files("me/tiny-gpt2-rope-64")
    assert files["model.safetensors"] == (tmp_path / "run" / "model" / "model.safetensors").read_bytes()
    card = files["README.md"].decode()
    assert "rope" in card and "32 -> 64" in card and "trained" in card and "4" in card


def test_bad_repo_id_is_refused_before_training(bases, tmp_path):
    raw = make_raw(bases, tmp_path / "run")
    raw["push_to_hub"] = "not a repo id"
    with pytest.raises(ValueError, match="push_to_hub: bad repo id"):
        recipe_from_dict(raw)


def test_streaming_local_jsonl(bases, tmp_path):
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"text": TEXT[i::3]}) + "\n" for i in range(3)))
    raw = make_raw(bases, tmp_path / "run", "gpt2", "interpolate", max_steps=6, save_every=3)
    raw["data"] = {"train": str(data), "streaming": True}
    with pytest.raises(Interrupted):
        run(raw, callbacks=[stop_at(4)])
    final = run(raw, resume=True)
    assert [json.loads(line)["step"] for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert posswap.from_pretrained(str(final)).config.posswap["method"] == "interpolate"


def test_position_lr_moves_position_parameters_at_their_own_rate(bases, tmp_path):
    """A new T5 bias starts at zero and Adam moves a weight about lr per step: at a fine-tuning lr it stays near zero.
    train.position_lr gives the position parameters their own rate; every other weight keeps train.lr."""
    raw = make_raw(bases, tmp_path / "run", "gpt2", "t5-bias", max_steps=3, lr=1e-7, position_lr=1e-2, save_every=100)
    weights, base = load_file(run(raw) / "model.safetensors"), load_file(bases / "gpt2" / "model.safetensors")
    bias = {k for k in weights if "posswap_bias_providers" in k}
    assert bias and bias.isdisjoint(base)
    assert max(weights[k].abs().max().item() for k in bias) > 5e-3  # Adam: about 1e-2 x (1 + 0.75 + 0.25 cosine)
    moved = max(
        (weights[k] - base[k]).abs().max().item() for k in base if k in weights and weights[k].shape == base[k].shape
    )
    assert moved < 1e-5  # everything else at about lr per step
