"""Names renamed in issue 24: a user's old name gets one line naming the new one; what an older posswap saved
(model folders, study runs) still loads, read with the new names."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model, sharpen_qk, token_ids

import posswap
from posswap.cli import main
from posswap.portable.posswap_block import migrate_block
from posswap.study.runner import same_recipe

NEW = 96


@pytest.mark.parametrize(
    "block,old,new",
    [
        ({"method": "rope", "max_length": 64, "scaling": "yarn"}, "scaling", "rope_type"),
        ({"method": "sinusoidal", "max_length": 64, "base": 500.0}, "base", "theta"),
    ],
)
def test_an_old_key_is_one_line_naming_the_new_one(block, old, new, tmp_path):
    message = f"'{old}' was renamed '{new}' in posswap {posswap.__version__}; use {new}."
    with pytest.raises(ValueError, match=message):
        posswap.config_from_dict(block)
    recipe = tmp_path / "recipe.yaml"  # a YAML recipe goes through config_from_dict too
    recipe.write_text(json.dumps({"model": "posswap:minilm", "posswap": block, "train": {"output_dir": "x"}}))
    with pytest.raises(ValueError, match=message):
        posswap.load_recipe(recipe)


def test_old_names_in_python_are_one_line_naming_the_new_one():
    with pytest.raises(AttributeError, match="posswap.NoPEConfig was renamed posswap.NopeConfig"):
        posswap.NoPEConfig  # noqa: B018
    with pytest.raises(AttributeError, match="posswap.functional was renamed posswap.portable.posswap_functional"):
        posswap.functional  # noqa: B018
    with pytest.raises(TypeError, match="push"):
        posswap.export(make_model("gpt2", "GPT2LMHeadModel"), "out", push="me/x")
    assert {"train", "load_recipe", "NopeConfig"} <= set(posswap.__all__)


@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["patch", "m", "--method", "rope", "--out", "o", "--max-length", "8", "--scaling", "yarn"],
            "--scaling was renamed --rope-type",
        ),
        (
            ["patch", "m", "--method", "sinusoidal", "--out", "o", "--max-length", "8", "--base", "500"],
            "--base was renamed --theta",
        ),
        (["study", "--base", "gpt2"], "--base was renamed --model"),
        (["study", "--budget", "long"], "--budget was renamed --phase"),
        (["demo", "--max-length", "4096"], "posswap demo no longer takes --max-length: it reads the minilm-embed-2k"),
        (["export", "m", "--out", "o", "--push", "me/x"], "export no longer pushes; run posswap push OUT REPO_ID"),
        (["study", "--variants", "rope,alibi"], "not commas: --variants rope alibi"),
        (["study", "--model", "gpt2,minilm"], "not commas: --model gpt2 minilm"),
        (["eval", "m", "--passkey-depths", "0,0.5"], "not commas: --passkey-depths 0 0.5"),
    ],
)
def test_an_old_flag_is_one_line_naming_the_new_one(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"posswap {argv[0]}: error: ") and expected in err, err
    assert list(tmp_path.iterdir()) == []  # refused before any work


def test_list_flags_take_spaces_and_repeat():
    parser = posswap.cli.build_parser()
    args = parser.parse_args(["eval", "m", "--lengths", "8", "16", "--lengths", "32", "--passkey-depths", "0", "1"])
    assert args.lengths == [8, 16, 32] and args.passkey_depths == [0.0, 1.0]
    args = parser.parse_args(["study", "--model", "gpt2", "--model", "minilm", "--variants", "rope", "alibi"])
    assert args.model == ["gpt2", "minilm"] and args.variants == ["rope", "alibi"]
    args = parser.parse_args(["train", "r.yaml", "--set", "train.lr=1e-4", "train.max_steps=2", "--set", "a=1"])
    assert args.set == ["train.lr=1e-4", "train.max_steps=2", "a=1"]
    assert parser.parse_args(["eval", "m"]).lengths is None  # the default is not extended by the flag


def saved_by_an_older_posswap(config, folder, old: dict[str, str]):
    """A folder saved with ``config``, its config.json's posswap block then written with the old key names."""
    model = posswap.patch(sharpen_qk(make_model("gpt2", "GPT2LMHeadModel")), config).eval()
    model.save_pretrained(folder)
    path = folder / "config.json"
    saved = json.loads(path.read_text())
    saved["posswap"] = {old.get(k, k): v for k, v in saved["posswap"].items()}
    path.write_text(json.dumps(saved))
    return model


@pytest.mark.parametrize(
    "config,old",
    [
        (posswap.RopeConfig(max_length=NEW, rope_type="yarn", theta=500.0), {"rope_type": "scaling"}),
        (posswap.SinusoidalConfig(max_length=NEW, theta=500.0), {"theta": "base"}),
    ],
    ids=["rope-scaling", "sinusoidal-base"],
)
def test_a_folder_saved_with_old_keys_loads_with_the_same_logits(config, old, tmp_path):
    model = saved_by_an_older_posswap(config, tmp_path / "old", old)
    assert set(old.values()) <= set(json.loads((tmp_path / "old" / "config.json").read_text())["posswap"])
    loaded = posswap.from_pretrained(str(tmp_path / "old")).eval()
    ids = token_ids(NEW)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert posswap.patched_config(loaded) == posswap.patched_config(model)  # read with today's names
    card = posswap.model_card(tmp_path / "old")  # the card reads the folder's block too
    assert f"`{next(iter(old))}`" in card


def test_migration_renames_only_what_an_older_posswap_wrote():
    block = {"method": "rope", "max_length": 8, "scaling": "yarn", "factor": 2.0}
    assert migrate_block(block) == {"method": "rope", "max_length": 8, "rope_type": "yarn", "factor": 2.0}
    current = {"method": "rope", "max_length": 8, "rope_type": "yarn"}
    assert migrate_block(current) is current and migrate_block(None) is None
    assert migrate_block({"method": "alibi", "scaling": 1}) == {"method": "alibi", "scaling": 1}  # not a rope key
    # A study run recorded by an older posswap is the same run: it is reused, not trained again.
    raw = {"model": "m", "posswap": {"method": "rope", "max_length": 8, "rope_type": "yarn"}}
    assert same_recipe({"model": "m", "posswap": {"method": "rope", "max_length": 8, "scaling": "yarn"}}, raw)
    assert not same_recipe({"model": "m", "posswap": {"method": "rope", "max_length": 16, "scaling": "yarn"}}, raw)


def test_train_and_load_recipe_are_public_without_loading_the_training_code_at_import():
    """``import posswap`` (patching, loading) does not bring in datasets; ``posswap.train`` loads it on first use."""
    import subprocess
    import sys

    script = (
        "import sys, posswap; assert 'datasets' not in sys.modules; "
        "from posswap import train, load_recipe; from posswap.training import train as t; assert train is t; "
        "assert 'datasets' in sys.modules and callable(load_recipe)"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
