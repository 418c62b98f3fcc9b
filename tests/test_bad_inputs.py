"""Bad inputs: each case is an input -> the error it must give (one line, exit 2) -> the files left as they were.

FILE_CASES: writers pointed at something that is not theirs to replace; the user's files stay byte for byte.
CLI_ERROR_CASES: a user's mistake in a flag, a recipe or a config.json; one line naming it, nothing written.
Then: --overwrite, staging folders of a killed run, permissions, --debug, the Python API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from conftest import save_tiny_gpt2

import posswap
from posswap.cli import main
from posswap.files import RETIRED, STAGING, remove_model_folder
from posswap.loading import save_model_and_tokenizer


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A tiny GPT-2 with the GPT-2 tokenizer (``gpt2``) and a tiny BERT (``bert``, position buffers)."""
    root = tmp_path_factory.mktemp("models")
    save_tiny_gpt2(root / "gpt2")
    bert = transformers.BertConfig(
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        max_position_embeddings=32,
    )
    transformers.BertModel(bert).save_pretrained(root / "bert")
    return root


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file (bytes), folder and link under ``root``, hidden ones included."""
    out = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        out[key] = f"link:{os.readlink(path)}" if path.is_symlink() else "dir" if path.is_dir() else path.read_bytes()
    return out


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    return code, err


def assert_one_line_error(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    lines = [line for line in err.splitlines() if "%|" not in line]  # transformers' loading progress bars
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("posswap "), err
    assert expected in lines[0], err


# -- FILE_CASES: writers never replace what they did not create -------------------------------------------


def user_folder(tmp: Path) -> Path:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("my notes\n")
    (tmp / "mine" / "data.bin").write_bytes(bytes(range(256)))
    return tmp / "mine"


def a_file(tmp: Path) -> Path:
    (tmp / "thesis.tex").write_text("\\documentclass{article}\n")
    return tmp / "thesis.tex"


def source_inside(tmp: Path, models: Path) -> tuple[Path, Path]:
    """A model folder that holds the source checkpoint (its config.json makes it look replaceable)."""
    import shutil

    shutil.copytree(models / "gpt2", tmp / "project" / "src")
    (tmp / "project" / "config.json").write_text("{}")
    return tmp / "project" / "src", tmp / "project"


def link_to_model(tmp: Path, models: Path) -> Path:
    import shutil

    shutil.copytree(models / "gpt2", tmp / "real")
    (tmp / "alias").symlink_to(tmp / "real", target_is_directory=True)
    return tmp / "alias"


PATCH = ["patch", "{gpt2}", "--method", "interpolate", "--max-length", "64", "--out"]

# (id, setup(tmp, models) -> {"out": ..., "model": ...}, extra flags, expected error)
FILE_CASES = [
    ("out-user-folder", lambda t, m: {"out": user_folder(t)}, [], "already exists and is not empty"),
    (
        "out-user-folder-overwrite",
        lambda t, m: {"out": user_folder(t)},
        ["--overwrite"],
        "is not a model folder (no config.json)",
    ),
    ("out-regular-file", lambda t, m: {"out": a_file(t)}, [], "exists and is not a folder"),
    ("out-regular-file-overwrite", lambda t, m: {"out": a_file(t)}, ["--overwrite"], "exists and is not a folder"),
    ("out-below-a-file", lambda t, m: {"out": a_file(t) / "sub"}, [], "is a file, not a folder"),
    (
        "out-is-source",
        lambda t, m: dict(zip(("model", "out"), (source_inside(t, m)[0],) * 2)),
        ["--overwrite"],
        "holds the model being read",
    ),
    (
        "out-parent-of-source",
        lambda t, m: dict(zip(("model", "out"), source_inside(t, m))),
        ["--overwrite"],
        "holds the model being read",
    ),
    (
        "out-parent-no-config",
        lambda t, m: {"out": t, "model": user_folder(t) and source_inside(t, m)[0]},
        ["--overwrite"],
        "is not a model folder",
    ),
    ("out-link-to-model", lambda t, m: {"out": link_to_model(t, m)}, ["--overwrite"], "(a file or a link)"),
    ("out-dot-user-folder", lambda t, m: {"out": ".", "cwd": user_folder(t)}, [], "already exists and is not empty"),
    (
        "out-dot-user-folder-overwrite",
        lambda t, m: {"out": ".", "cwd": user_folder(t)},
        ["--overwrite"],
        "is not a model folder",
    ),
]


@pytest.mark.parametrize("setup,flags,expected", [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_patch_never_replaces_what_it_did_not_create(models, tmp_path, monkeypatch, capsys, setup, flags, expected):
    where = setup(tmp_path, models)
    if "cwd" in where:
        monkeypatch.chdir(where["cwd"])
    before, source_before = tree(tmp_path), tree(models)
    argv = [a.format(gpt2=where.get("model", models / "gpt2")) for a in PATCH] + [where["out"], *flags]
    assert_one_line_error(*run_cli(argv, capsys), expected)
    assert tree(tmp_path) == before and tree(models) == source_before


def recipe(tmp: Path, models: Path, **changes) -> Path:
    raw = {"model": str(models / "gpt2"), "posswap": None, "train": {"output_dir": str(tmp / "run"), "max_steps": 1}}
    for key, value in changes.items():
        block, _, leaf = key.rpartition("__")
        (raw.setdefault(block, {}) if block else raw)[leaf] = value
    path = tmp / "recipe.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


def run_with_user_model_folder(tmp: Path, models: Path) -> Path:
    (tmp / "run" / "model").mkdir(parents=True)
    (tmp / "run" / "model" / "weights-i-care-about.txt").write_text("keep me\n")
    return recipe(tmp, models)


# Writers other than patch: train's final save (checked before training) and eval --out (before scoring).
OTHER_WRITER_CASES = [
    (
        "train-model-folder-taken",
        lambda t, m: ["train", run_with_user_model_folder(t, m)],
        "already exists and is not empty",
    ),
    (
        "train-model-folder-taken-overwrite",
        lambda t, m: ["train", run_with_user_model_folder(t, m), "--overwrite"],
        "is not a model folder",
    ),
    (
        "train-resume-model-folder-taken",
        lambda t, m: ["train", run_with_user_model_folder(t, m), "--resume"],
        "is not a model folder",
    ),
    (
        "eval-out-file",
        lambda t, m: ["eval", m / "gpt2", "--lengths", "8", "--out", a_file(t)],
        "is a file, not a folder",
    ),
    (
        "eval-out-below-file",
        lambda t, m: ["eval", m / "gpt2", "--lengths", "8", "--out", a_file(t) / "report"],
        "is a file, not a folder",
    ),
]


@pytest.mark.parametrize("argv,expected", [c[1:] for c in OTHER_WRITER_CASES], ids=[c[0] for c in OTHER_WRITER_CASES])
def test_other_writers_fail_before_work(models, tmp_path, monkeypatch, capsys, argv, expected):
    import posswap.evaluation
    import posswap.training.loop

    def no_work(*args, **kwargs):
        raise AssertionError("the error must come before any scoring or training")

    monkeypatch.setattr(posswap.evaluation.harness, "token_stream", no_work)
    monkeypatch.setattr(posswap.training.loop, "Accelerator", no_work)
    argv = argv(tmp_path, models)
    before = tree(tmp_path)
    code, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, expected)
    assert tree(tmp_path) == before


# -- CLI_ERROR_CASES: one line that names the field, flag or file -----------------------------------------


def config_with_block(tmp: Path, models: Path, block) -> Path:
    import shutil

    shutil.copytree(models / "gpt2", tmp / "edited")
    config = json.loads((tmp / "edited" / "config.json").read_text())
    config["posswap"] = block
    (tmp / "edited" / "config.json").write_text(json.dumps(config))
    return tmp / "edited"


def write(tmp: Path, name: str, content: str | bytes) -> Path:
    path = tmp / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


GIANT = str(10**9)
NEW = "{tmp}/new"  # an --out that does not exist: nothing may be written there

# (id, argv(tmp, models), expected error)
CLI_ERROR_CASES = [
    ("recipe-not-yaml", lambda t, m: ["train", write(t, "r.yaml", "model: [unclosed\n")], "is not valid YAML (line"),
    ("recipe-binary", lambda t, m: ["train", write(t, "r.yaml", b"\xff\xfe\x00binary")], "is not valid YAML"),
    ("recipe-a-list", lambda t, m: ["train", write(t, "r.yaml", "- model\n- posswap\n")], "must be a YAML mapping"),
    ("recipe-missing", lambda t, m: ["train", t / "nope.yaml"], "No recipe file"),
    (
        "recipe-tokenizer-int",
        lambda t, m: ["train", recipe(t, m, tokenizer=123)],
        "tokenizer must be a non-empty string",
    ),
    (
        "recipe-mlm-probability-word",
        lambda t, m: ["train", recipe(t, m, train__mlm_probability="high")],
        "train.mlm_probability must be a number > 0 and < 1",
    ),
    ("recipe-seed-word", lambda t, m: ["train", recipe(t, m, train__seed="abc")], "train.seed must be an integer"),
    (
        "recipe-set-seed-word",
        lambda t, m: ["train", recipe(t, m), "--set", "train.seed=abc"],
        "train.seed must be an integer",
    ),
    (
        "recipe-model-missing-folder",
        lambda t, m: ["train", recipe(t, m, model="./nope")],
        "model: no local folder './nope'",
    ),
    (
        "eval-passkey-depths-word",
        lambda t, m: ["eval", m / "gpt2", "--passkey-depths", "abc", "--out", NEW],
        "argument --passkey-depths: invalid float value: 'abc'",
    ),
    (
        "eval-lengths-word",
        lambda t, m: ["eval", m / "gpt2", "--lengths", "abc", "--out", NEW],
        "argument --lengths: invalid int value: 'abc'",
    ),
    ("eval-missing-folder", lambda t, m: ["eval", "./nope", "--out", NEW], "No model folder './nope'"),
    (
        "patch-missing-folder",
        lambda t, m: ["patch", "./nope", "--method", "rope", "--max-length", "64", "--out", NEW],
        "No model folder './nope'",
    ),
    (
        "patch-missing-nested-folder",
        lambda t, m: ["patch", t / "a" / "b" / "c", "--method", "rope", "--max-length", "64", "--out", NEW],
        "No model folder",
    ),
    (
        "patch-max-length-word",
        lambda t, m: ["patch", m / "gpt2", "--method", "rope", "--max-length", "abc", "--out", NEW],
        "max_length must be a positive integer",
    ),
    (
        "patch-posswap-block-string",
        lambda t, m: ["patch", config_with_block(t, m, "rope"), "--method", "rope", "--max-length", "64", "--out", NEW],
        "'posswap' block must be a mapping",
    ),
    (
        "patch-posswap-block-list",
        lambda t, m: [
            "patch",
            config_with_block(t, m, ["rope", 64]),
            "--method",
            "rope",
            "--max-length",
            "64",
            "--out",
            NEW,
        ],
        "got list",
    ),
    (
        "eval-posswap-block-no-original-length",
        lambda t, m: ["eval", config_with_block(t, m, {"method": "rope", "max_length": 64}), "--out", NEW],
        "without original_length",
    ),
    (
        "patch-interpolate-giant",
        lambda t, m: ["patch", m / "gpt2", "--method", "interpolate", "--max-length", GIANT, "--out", NEW],
        f"max_length {GIANT} needs about",
    ),
    (
        "patch-rope-giant-buffers",
        lambda t, m: ["patch", m / "bert", "--method", "rope", "--max-length", str(10**11), "--out", NEW],
        "choose a smaller max_length",
    ),
    (
        "train-interpolate-giant",
        lambda t, m: ["train", recipe(t, m, posswap={"method": "interpolate", "max_length": 10**9})],
        "needs about",
    ),
]


@pytest.mark.parametrize("case,argv,expected", CLI_ERROR_CASES, ids=[c[0] for c in CLI_ERROR_CASES])
def test_cli_error_is_one_line(models, tmp_path, monkeypatch, capsys, case, argv, expected):
    import posswap.training.loop

    def no_training(*args, **kwargs):
        raise AssertionError("the error must come before training starts")

    if case != "train-interpolate-giant":  # found when the model is patched, after the accelerator starts
        monkeypatch.setattr(posswap.training.loop, "Accelerator", no_training)
    argv = [str(a).format(tmp=tmp_path) for a in argv(tmp_path, models)]
    before, source_before = tree(tmp_path), tree(models)
    assert_one_line_error(*run_cli(argv, capsys), expected)
    assert tree(tmp_path) == before and tree(models) == source_before
    assert not (tmp_path / "new").exists()


def test_debug_shows_the_traceback_before_or_after_the_command(tmp_path, capsys):
    argv = ["patch", "./nope", "--method", "rope", "--max-length", "64", "--out", str(tmp_path / "o")]
    for debug_argv in (["--debug", *argv], [*argv, "--debug"]):
        with pytest.raises(ValueError, match="No model folder"):
            main(debug_argv)
    assert main(argv) == 2


def test_unexpected_error_is_one_line_with_exit_1(monkeypatch, capsys):
    import posswap.cli.commands

    monkeypatch.setattr(posswap.cli.commands, "demo_command", lambda args: {}["bug"])
    assert main(["demo"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "KeyError" in err and "--debug" in err


# -- the Python API ---------------------------------------------------------------------------------------


def test_from_pretrained_model_class_not_a_class(models):
    with pytest.raises(TypeError, match="model_class must be a transformers model class"):
        posswap.from_pretrained(str(models / "gpt2"), model_class="notaclass")


def test_from_pretrained_names_a_bad_posswap_block(models, tmp_path):
    folder = config_with_block(tmp_path, models, "rope")
    with pytest.raises(ValueError, match="config.json: the 'posswap' block must be a mapping"):
        posswap.from_pretrained(str(folder))


def test_evaluate_out_file_fails_before_scoring(models, tmp_path, monkeypatch):
    import posswap.evaluation.harness as harness

    monkeypatch.setattr(harness, "token_stream", lambda *a, **k: pytest.fail("scored before checking out"))
    with pytest.raises(ValueError, match="is a file, not a folder"):
        posswap.evaluate({"m": str(models / "gpt2")}, lengths=[8], out=a_file(tmp_path))


def test_patch_interpolate_giant_leaves_model_untouched():
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=99, n_positions=32)
    )
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="choose a smaller max_length"):
        posswap.patch(model, posswap.InterpolateConfig(max_length=10**9))
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())


def test_patch_rope_giant_buffers_refused_by_the_api():
    model = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
        )
    )
    with pytest.raises(ValueError, match="choose a smaller max_length"):
        posswap.patch(model, posswap.RopeConfig(max_length=10**11))


def test_study_removes_only_model_folders(tmp_path):
    user_folder(tmp_path)
    before = tree(tmp_path)
    with pytest.raises(ValueError, match="not a model folder"):
        remove_model_folder(tmp_path / "mine")
    assert tree(tmp_path) == before


# -- --overwrite, staging folders, permissions ------------------------------------------------------------


def patch_to(models: Path, out, length: int, *flags) -> int:
    return main(
        [
            "patch",
            str(models / "gpt2"),
            "--method",
            "interpolate",
            "--max-length",
            str(length),
            "--out",
            str(out),
            *flags,
        ]
    )


def test_overwrite_replaces_a_model_folder(models, tmp_path, capsys):
    out = tmp_path / "patched"
    assert patch_to(models, out, 64) == 0
    assert patch_to(models, out, 128) == 2  # not without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    assert patch_to(models, out, 128, "--overwrite") == 0
    assert posswap.from_pretrained(str(out)).config.n_positions == 128
    assert sorted(p.name for p in tmp_path.iterdir()) == ["patched"]  # nothing staged is left beside it


def test_overwrite_is_atomic_when_the_write_fails(models, tmp_path):
    out = tmp_path / "patched"
    assert patch_to(models, out, 64) == 0
    before = tree(tmp_path)

    class Broken:
        def save_pretrained(self, folder):
            (Path(folder) / "config.json").write_text("{}")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_model_and_tokenizer(Broken(), None, out, overwrite=True)
    assert tree(tmp_path) == before


def test_out_dot_overwrite_replaces_the_model_folder_in_place(models, tmp_path, monkeypatch):
    out = tmp_path / "patched"
    assert patch_to(models, out, 64) == 0
    monkeypatch.chdir(out)
    assert patch_to(models, ".", 128, "--overwrite") == 0
    monkeypatch.chdir(tmp_path)
    assert json.loads((out / "config.json").read_text())["n_positions"] == 128
    assert sorted(p.name for p in tmp_path.iterdir()) == ["patched"]  # no ..old.XXXX


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_staging_of_a_killed_run_is_cleaned_by_the_next(models, tmp_path):
    out = tmp_path / "patched"
    assert patch_to(models, out, 64) == 0
    dead, live = dead_pid(), os.getpid()
    for name in (
        f".patched.{STAGING}-{dead}-00aa",
        f".patched.{RETIRED}-{dead}-00bb",
        f".patched.{STAGING}-{live}-00cc",
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".patched.not-ours").mkdir()
    assert patch_to(models, out, 128, "--overwrite") == 0
    # The dead run's folders are gone; a live writer's and anything else are left alone.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".patched.not-ours",
        f".patched.{STAGING}-{live}-00cc",
        "patched",
    ]


def test_a_model_folder_replaced_by_a_killed_run_comes_back(models, tmp_path):
    """Killed between moving the old model aside and moving the new one in: the old one is restored."""
    out = tmp_path / "patched"
    assert patch_to(models, out, 64) == 0
    retired = tmp_path / f".patched.{RETIRED}-{dead_pid()}-00aa"
    out.rename(retired)
    before = tree(retired)
    assert patch_to(models, out, 128) == 2  # the next run finds it back, and refuses to replace it
    assert tree(out) == before and not retired.exists()


@pytest.mark.parametrize("umask,folder_mode,file_mode", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_written_folders_follow_the_umask(models, tmp_path, umask, folder_mode, file_mode):
    old = os.umask(umask)
    try:
        assert patch_to(models, tmp_path / "a" / "patched", 64) == 0
    finally:
        os.umask(old)
    for path in [tmp_path / "a", tmp_path / "a" / "patched", *(tmp_path / "a" / "patched").iterdir()]:
        assert path.stat().st_mode & 0o777 == (folder_mode if path.is_dir() else file_mode), path
