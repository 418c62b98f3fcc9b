"""The recipes ship with posswap and are taken by name: ``posswap train NAME``, ``posswap.load_recipe(NAME)``,
``posswap train --list``. A path still works; a name that is neither a file nor a shipped recipe lists the names.
(That the wheel carries them and runs one outside a clone: tests/test_wheel.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from test_bad_inputs import assert_one_line_error

import posswap
from posswap.cli import main

RECIPES = Path(__file__).parents[1] / "recipes"
NAMES = sorted(path.stem for path in RECIPES.glob("*.yaml"))  # the training recipes; accelerate/ holds configs


def first_comment(path: Path) -> str:
    line = path.read_text().splitlines()[0]
    assert line.startswith("# "), f"{path.name} must open with a comment saying what it trains"
    return line[2:]


def test_the_shipped_recipes_are_the_repositorys():
    from posswap.shipped_recipes import shipped_recipes

    assert len(NAMES) >= 7 and "minilm-embed-2k" in NAMES
    assert {name: path.resolve() for name, path in shipped_recipes().items()} == {
        name: (RECIPES / f"{name}.yaml").resolve() for name in NAMES
    }


@pytest.mark.parametrize("name", NAMES)
def test_a_name_loads_what_its_file_loads(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no recipes/ here: the name alone finds it
    by_name, raw = posswap.load_recipe(name, ["train.max_steps=3"])
    by_path, raw_from_file = posswap.load_recipe(RECIPES / f"{name}.yaml", ["train.max_steps=3"])
    assert by_name.to_dict() == by_path.to_dict() and raw == raw_from_file
    assert raw == {**yaml.safe_load((RECIPES / f"{name}.yaml").read_text()), "train": raw["train"]}
    assert by_name.train.max_steps == 3


@pytest.mark.parametrize("name", NAMES)
def test_each_recipe_opens_with_a_one_line_purpose(name):
    purpose = first_comment(RECIPES / f"{name}.yaml")
    assert purpose.endswith(".") and 30 < len(purpose) <= 120, purpose  # a sentence that --list shows whole


def test_list_shows_each_recipe_with_its_purpose(capsys):
    assert main(["train", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split(None, 1)[1] for line in lines[:-1]}
    assert rows == {name: first_comment(RECIPES / f"{name}.yaml") for name in NAMES}
    assert lines[-1].startswith("Run one with: posswap train NAME") and str(RECIPES.resolve()) in lines[-1]


def test_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="No recipe file 'gpt2-rope-8k' and no shipped recipe") as error:
        posswap.load_recipe("gpt2-rope-8k")
    assert all(name in str(error.value) for name in NAMES)
    assert_one_line_error(main(["train", "gpt2-rope-8k"]), capsys.readouterr().err.strip(), ", ".join(NAMES))
    assert list(tmp_path.iterdir()) == []


def test_the_readmes_path_outside_a_clone_names_the_recipe(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # `posswap train recipes/minilm-embed-2k.yaml` where there is no recipes/
    code = main(["train", "recipes/minilm-embed-2k.yaml"])
    assert_one_line_error(code, capsys.readouterr().err.strip(), "posswap train minilm-embed-2k")


def test_a_file_of_ones_own_still_works(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text((RECIPES / "gpt2-rope-4k.yaml").read_text().replace("max_steps: 1000", "max_steps: 5"))
    recipe, _ = posswap.load_recipe(mine)
    assert recipe.train.max_steps == 5


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["train"], "give a RECIPE (a YAML file, or the name of a shipped recipe), or --list"),
        (["train", "--list", "gpt2-rope-4k"], "--list lists the shipped recipes and runs none: drop RECIPE"),
        (["train", "--list", "--resume"], "drop --resume"),
    ],
)
def test_train_needs_a_recipe_or_list_alone(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(main(argv), capsys.readouterr().err.strip(), expected)
    assert list(tmp_path.iterdir()) == []
