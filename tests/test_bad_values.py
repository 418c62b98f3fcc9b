"""Every bad value is refused before anything runs: NaN / inf / wrong types in method configs, recipes and CLI
options, missing local files, and a --resume with another recipe. Each case: input -> the error names the
field -> nothing written, model unchanged. Also: ``1e6`` / ``3e-3`` are numbers wherever posswap reads YAML."""

from __future__ import annotations

import json
import math

import pytest
import transformers
import yaml
from conftest import assert_untouched, make_model, snapshot

import posswap
from posswap.cli import build_parser, main
from posswap.config import load_yaml
from posswap.training.recipe import load_recipe

NAN, INF = float("nan"), float("inf")

# (kind, input, expected error text). kinds:
#   config: a posswap block for posswap.config_from_dict, then patch (never reached) on a tiny GPT-2
#   recipe: --set overrides on a valid recipe; load_recipe and `posswap train` both refuse it
#   source: --set overrides naming missing / unreadable local files; `posswap train` refuses before loading
#   cli:    argv for posswap.cli.main ({tmp} is the test's folder); exit code 2, one line naming the field
VALUE_CASES = [
    ("config", {"method": "rope", "theta": NAN}, "theta must be a finite number > 1, got nan"),
    ("config", {"method": "rope", "theta": INF}, "theta must be a finite number > 1, got inf"),
    ("config", {"method": "rope", "theta": "1e6"}, "theta must be a number > 1, got '1e6'"),
    ("config", {"method": "rope", "theta": True}, "theta must be a number > 1, got True"),
    ("config", {"method": "rope", "theta": 1}, "theta must be a number > 1, got 1"),
    (
        "config",
        {"method": "rope", "rope_type": "linear", "factor": NAN},
        "factor must be a finite number >= 1, got nan",
    ),
    ("config", {"method": "rope", "rope_type": "yarn", "factor": INF}, "factor must be a finite number >= 1, got inf"),
    ("config", {"method": "rope", "rope_type": "dynamic", "factor": -INF}, "factor must be a finite number >= 1"),
    ("config", {"method": "rope", "rope_type": "yarn", "factor": "4"}, "factor must be a number >= 1, got '4'"),
    ("config", {"method": "rope", "rotary_dim": NAN}, "rotary_dim must be a fraction"),
    ("config", {"method": "alibi", "symmetric": "yes"}, "symmetric must be true, false or None"),
    ("config", {"method": "alibi", "max_length": 4096.5}, "max_length must be a positive integer, got 4096.5"),
    ("config", {"method": "interpolate", "max_length": INF}, "max_length must be a positive integer, got inf"),
    ("config", {"method": "interpolate", "max_length": NAN}, "max_length must be a positive integer, got nan"),
    ("recipe", ["train.lr=.nan"], "train.lr must be a finite number > 0, got nan"),
    ("recipe", ["train.lr=.inf"], "train.lr must be a finite number > 0, got inf"),
    ("recipe", ["train.lr=0"], "train.lr must be a number > 0, got 0"),
    ("recipe", ["train.lr=fast"], "train.lr must be a number > 0, got 'fast'"),
    ("recipe", ["train.weight_decay=lots"], "train.weight_decay must be a number >= 0, got 'lots'"),
    ("recipe", ["train.weight_decay=-0.1"], "train.weight_decay must be a number >= 0"),
    ("recipe", ["train.weight_decay=.nan"], "train.weight_decay must be a finite number >= 0"),
    ("recipe", ["train.mlm_probability=.nan"], "train.mlm_probability must be a finite number > 0 and < 1"),
    ("recipe", ["train.mlm_probability=1"], "train.mlm_probability must be a number > 0 and < 1, got 1"),
    ("recipe", ["train.warmup_steps=2.5"], "train.warmup_steps must be an integer >= 0, got 2.5"),
    ("recipe", ["train.warmup_steps=-1"], "train.warmup_steps must be an integer >= 0, got -1"),
    ("recipe", ["train.lora.dropout=.nan"], "train.lora.dropout must be a finite number >= 0 and < 1"),
    ("recipe", ["train.seed=-1"], "train.seed must be an integer >= 0"),
    # A whole number with an exponent is that integer (issue 45: tests/test_reliability_runs.py); a fraction is not.
    ("recipe", ["train.max_steps=1.5e0"], "train.max_steps must be a positive integer, got 1.5"),
    ("recipe", ["train.gradient_checkpointing='yes'"], "train.gradient_checkpointing must be true or false"),
    ("recipe", ["train.pose_window=.inf"], "train.pose_window must be a positive integer, got inf"),
    ("recipe", ["train.curriculum=64"], "train.curriculum must be a list"),
    ("recipe", ["train.output_dir=''"], "train.output_dir must be a non-empty string"),
    ("recipe", ["data.streaming='no'"], "data.streaming must be true or false"),
    ("recipe", ["eval.lengths=[1, 64]"], "eval.lengths entries must be an integer >= 2, got 1"),
    ("recipe", ["eval.lengths=[.nan]"], "eval.lengths entries must be an integer >= 2, got nan"),
    ("recipe", ["eval.lengths=64"], "eval.lengths must be a non-empty list"),
    ("recipe", ["eval.beyond=wrap"], "eval.beyond must be one of 'truncate', 'sliding'"),
    ("recipe", ["eval.max_tokens=0"], "eval.max_tokens must be an integer >= 1"),
    ("recipe", ["eval.passkey_trials=-1"], "eval.passkey_trials must be an integer >= 0"),
    ("recipe", ["eval.data=3"], "eval.data must be a non-empty string"),
    ("recipe", ["posswap.theta=.nan"], "theta must be a finite number > 1"),
    ("recipe", ["posswap.rope_type=yarn", "posswap.factor=.inf"], "factor must be a finite number >= 1"),
    ("source", ["model=./no-such-model"], "model: no local folder './no-such-model'"),
    ("source", ["model={tmp}/empty"], "has no config.json"),
    ("source", ["tokenizer=./no-such-tokenizer"], "tokenizer: no local folder"),
    ("source", ["model=posswap:nope"], "no embedded model 'posswap:nope'"),
    ("source", ["data.train={tmp}/missing.txt"], "data.train: no local file"),
    ("source", ["data.train={tmp}/table.csv"], "data.train: cannot read"),
    ("source", ["data.train=posswap:austen-tran"], "data.train: no embedded split"),
    ("source", ["eval.lengths=[32]", "eval.data={tmp}/missing.jsonl"], "eval.data: no local file"),
    (
        "cli",
        ["patch", "{tmp}/m", "--method", "rope", "--max-length", "64", "--theta", ".nan", "--out", "{tmp}/out"],
        "theta must be a finite number > 1",
    ),
    (
        "cli",
        ["patch", "{tmp}/m", "--method", "rope", "--max-length", "64", "--theta", "nan", "--out", "{tmp}/out"],
        "theta must be a number > 1, got 'nan'",
    ),
    (
        "cli",
        [
            "patch",
            "{tmp}/m",
            "--method",
            "rope",
            "--max-length",
            "64",
            "--rope-type",
            "yarn",
            "--factor",
            ".inf",
            "--out",
            "{tmp}/out",
        ],
        "factor must be a finite",
    ),
    (
        "cli",
        ["patch", "{tmp}/m", "--method", "interpolate", "--max-length", "4.0965e3", "--out", "{tmp}/out"],
        "max_length must be a positive integer, got 4096.5",
    ),
    (
        "cli",
        ["eval", "{tmp}/m", "--passkey-depths", "0", "nan", "--out", "{tmp}/out"],
        "passkey depths must be a finite number >= 0 and <= 1",
    ),
    ("cli", ["eval", "{tmp}/m", "--max-tokens", "0", "--out", "{tmp}/out"], "max_tokens must be an integer >= 1"),
    ("cli", ["study", "--preset", "mini", "--lr", "nan", "--work", "{tmp}/out"], "--lr must be a finite number > 0"),
    ("cli", ["study", "--preset", "mini", "--lr", "inf", "--work", "{tmp}/out"], "--lr must be a finite number > 0"),
    ("cli", ["train", "{tmp}/recipe.yaml", "--force"], "--force only applies with --resume"),
]


def case_id(case) -> str:
    kind, value, _ = case
    return f"{kind}-" + (
        " ".join(value) if isinstance(value, list) else ",".join(f"{k}={v}" for k, v in value.items() if k != "method")
    )


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder with a valid recipe (and its model / data); the test runs in it, so ./ paths are local."""
    monkeypatch.chdir(tmp_path)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=99, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "model")
    (tmp_path / "empty").mkdir()
    (tmp_path / "text.txt").write_text("Some text. " * 50)
    (tmp_path / "table.csv").write_text("text\nhello\n")
    raw = {
        "model": str(tmp_path / "model"),
        "posswap": {"method": "rope", "max_length": 64},
        "data": {"train": str(tmp_path / "text.txt")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "lr": 3e-3},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(raw))
    return tmp_path


def expect_refusal(argv: list[str], expected: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err
    assert len(err.splitlines()) == 1, err


@pytest.mark.parametrize("case", VALUE_CASES, ids=[case_id(c) for c in VALUE_CASES])
def test_bad_value_is_refused_before_anything_runs(case, workdir, capsys):
    kind, value, expected = case
    if kind == "config":
        model = make_model("gpt2", "GPT2LMHeadModel")
        before = snapshot(model)
        with pytest.raises(ValueError) as error:
            posswap.patch(model, posswap.config_from_dict({"max_length": 64, **value}))
        assert expected in str(error.value)
        assert_untouched(model, before)
        return
    if kind == "cli":
        expect_refusal([a.format(tmp=workdir) for a in value], expected, capsys)
    else:
        overrides = [v.format(tmp=workdir) for v in value]
        if kind == "recipe":
            with pytest.raises(ValueError) as error:
                load_recipe(workdir / "recipe.yaml", overrides)
            assert expected in str(error.value)
        argv = ["train", str(workdir / "recipe.yaml")] + [a for o in overrides for a in ("--set", o)]
        expect_refusal(argv, expected, capsys)
    assert not (workdir / "run").exists() and not (workdir / "out").exists()


def test_enough_cases():
    assert len(VALUE_CASES) >= 25


# --- exponent floats ----------------------------------------------------------------------------------------


def test_yaml_reads_exponents_as_floats_and_keeps_safe_load_otherwise():
    assert load_yaml("[1e6, 3e-3, 1.0e6, -2E+3, 1.5e-3, 4096, 0.5, yarn, null, '1e6', 1e]") == [
        1e6,
        3e-3,
        1e6,
        -2e3,
        1.5e-3,
        4096,
        0.5,
        "yarn",
        None,
        "1e6",
        "1e",
    ]
    assert yaml.safe_load("1e6") == "1e6"  # the loader is posswap's own: PyYAML's stays as it was


def test_recipe_with_exponent_lr_and_theta(workdir):
    text = (workdir / "recipe.yaml").read_text().replace("lr: 0.003", "lr: 3e-3")
    (workdir / "recipe.yaml").write_text(text.replace("method: rope", "method: rope\n  theta: 1e6"))
    recipe, raw = load_recipe(workdir / "recipe.yaml")
    assert recipe.train.lr == 3e-3 and isinstance(recipe.train.lr, float)
    assert recipe.posswap.theta == 1e6 and isinstance(recipe.posswap.theta, float)
    recipe, _ = load_recipe(workdir / "recipe.yaml", ["train.lr=5e-4", "train.weight_decay=1e-2"])
    assert (recipe.train.lr, recipe.train.weight_decay) == (5e-4, 1e-2)


def test_cli_theta_exponent_patches_and_saves(workdir):
    args = build_parser().parse_args(["patch", "m", "--method", "rope", "--theta", "1e6", "--out", "o"])
    assert args.theta == 1e6 and isinstance(args.theta, float)
    assert (
        main(
            [
                "patch",
                str(workdir / "model"),
                "--method",
                "rope",
                "--max-length",
                "64",
                "--theta",
                "1e6",
                "--out",
                str(workdir / "p"),
            ]
        )
        == 0
    )
    assert posswap.from_pretrained(str(workdir / "p")).config.posswap["theta"] == 1e6


# --- resume with another recipe -----------------------------------------------------------------------------


def test_resume_with_another_recipe_is_refused_unless_forced(bases, tmp_path, capsys):
    raw = {
        "model": str(bases / "gpt2"),
        "posswap": {"method": "rope", "max_length": 64},
        "data": {"train": str(bases / "text.txt")},
        "train": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 4,
            "batch_size": 2,
            "lr": 3e-3,
            "save_every": 2,
            "log_every": 1,
        },
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 0
    capsys.readouterr()  # the first run's progress bars
    stored = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert stored["train"]["lr"] == 3e-3 and stored["posswap"]["theta"] == 10000.0  # resolved: defaults filled in
    before = (tmp_path / "run" / "model" / "model.safetensors").read_bytes()

    expect_refusal(["train", str(path), "--resume", "--set", "train.lr=1e-3"], "train.lr (0.003 -> 0.001)", capsys)
    expect_refusal(["train", str(path), "--resume", "--set", "posswap.theta=5e4"], "posswap.theta", capsys)
    assert (tmp_path / "run" / "model" / "model.safetensors").read_bytes() == before  # nothing trained
    # Keys that cannot change the weights may change.
    assert main(["train", str(path), "--resume", "--set", "train.log_every=2", "--set", "eval.lengths=[]"]) == 0
    assert main(["train", str(path), "--resume", "--force", "--set", "train.lr=1e-3"]) == 0
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["train"]["lr"] == 1e-3
    assert (tmp_path / "run" / "model" / "model.safetensors").read_bytes() != before
    # The new lr is used from the checkpoint on (the checkpoint's optimizer state carried the old one).
    log = {
        entry["step"]: entry["lr"]
        for entry in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
    }
    assert log[3] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 3 / 4)))
    # train.position_lr adds optimizer groups: the checkpoint's optimizer cannot carry over, and the error says why.
    capsys.readouterr()
    assert main(["train", str(path), "--resume", "--force", "--set", "train.position_lr=1e-2"]) == 2
    assert "train.position_lr was set or unset since" in capsys.readouterr().err
