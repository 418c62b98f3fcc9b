"""The command line's rough edges (issue 60): ``posswap --version``, a description for every command's ``--help``,
``export --overwrite``, a damaged model folder named before any work, a missing ONNX extra named, the LanceDB
example's errors as one line, and one rule for lengths past what the models read in every retrieval task. Each
refusal: exit 2, one line on stderr that names the file, flag or extra and what to do."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from test_bad_inputs import assert_one_line_error, tree

import posswap
from posswap.cli import build_parser, main
from posswap.data import GPT2_TOKENIZER_DIR
from posswap.version import __version__

ROOT = Path(__file__).parents[1]
HEAVY = ("torch", "transformers")
ONNX = all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime", "onnxscript"))  # the onnx extra
FORMATS = ["native", pytest.param("onnx", marks=pytest.mark.skipif(not ONNX, reason="pip install 'posswap[onnx]'"))]


def python(code: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``python -c code`` in a fresh process that imports this checkout's posswap, offline."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


@pytest.fixture
def rope_folder(tmp_path) -> Path:
    """A tiny GPT-2 patched with RoPE (an exact GPT-NeoX export), saved with the GPT-2 tokenizer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=32)
    model = posswap.patch(transformers.GPT2LMHeadModel(config), posswap.RopeConfig(max_length=64), tokenizer=tokenizer)
    folder = tmp_path / "rope"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# -- 5. posswap --version ---------------------------------------------------------------------------------------


def test_version_prints_the_version_without_importing_torch():
    done = python(
        "import sys\nfrom posswap.cli import main\ntry:\n    main(['--version'])\nexcept SystemExit as e:\n"
        f"    print('exit', e.code, [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    assert done.stdout.splitlines() == [f"posswap {__version__}", "exit 0 []"], done.stderr


# -- 6. every command's --help says what it does, with an example -------------------------------------------------


def test_every_command_has_a_description_with_an_example_and_export_out_covers_onnx():
    parser = build_parser()
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    for name in ("patch", "train", "eval", "push", "export", "study", "demo"):
        description = commands[name].description or ""
        assert len(description) > 80, f"posswap {name} --help has no description paragraph"
        if name != "demo":  # the demo takes no argument: its paragraph is the example
            assert f"posswap {name} " in description, f"posswap {name} --help shows no example"
    out = next(a for a in commands["export"]._actions if "--out" in a.option_strings)
    assert "ONNX" in out.help and "native" in out.help


# -- 7. posswap export --overwrite ----------------------------------------------------------------------------------


def test_export_overwrite_replaces_an_export_and_never_the_input_or_a_user_folder(rope_folder, tmp_path, capsys):
    out = tmp_path / "neox"
    assert main(["export", str(rope_folder), "--out", str(out)]) == 0
    capsys.readouterr()
    before, first = tree(tmp_path), (out / "config.json").stat().st_ino
    assert main(["export", str(rope_folder), "--out", str(out)]) == 2  # the advice it gives is a flag export takes
    assert "pass --overwrite" in capsys.readouterr().err and tree(tmp_path) == before
    assert main(["export", str(rope_folder), "--out", str(out), "--overwrite"]) == 0, capsys.readouterr().err
    assert "GPTNeoXForCausalLM" in capsys.readouterr().out and (out / "config.json").stat().st_ino != first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging or lock left behind
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes\n")
    before = tree(tmp_path)
    code = main(["export", str(rope_folder), "--out", str(mine), "--overwrite"])
    assert_one_line_error(code, capsys.readouterr().err, "is not a model folder (no config.json)")
    for format in ["native", "onnx"] if ONNX else ["native"]:
        for flags in ([], ["--overwrite"]):  # the input itself: refused whatever the flag, with advice that works
            code = main(["export", str(rope_folder), "--out", str(rope_folder), "--format", format, *flags])
            err = capsys.readouterr().err
            assert_one_line_error(code, err, "holds the model being read")
            assert "--overwrite" not in err and "another folder" in err
    assert tree(tmp_path) == before


# -- 8. a damaged model folder is named before any work -------------------------------------------------------------


def cut_config(folder: Path) -> str:
    path = folder / "config.json"
    path.write_text(path.read_text()[:30])
    return f"{path} is not valid JSON"


def no_config(folder: Path) -> str:
    (folder / "config.json").unlink()
    return f"{folder} has no config.json"


def zero_weights(folder: Path) -> str:
    (folder / "model.safetensors").write_bytes(bytes(100))
    return f"{folder / 'model.safetensors'} is not a readable safetensors file"


@pytest.mark.parametrize("damage", [cut_config, no_config, zero_weights])
@pytest.mark.parametrize("format", FORMATS)
def test_export_names_a_damaged_file_of_the_model_folder_before_any_work(
    rope_folder, tmp_path, capsys, monkeypatch, damage, format
):
    expected = damage(rope_folder)
    import posswap.loading

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(posswap.loading, "load_model_and_tokenizer", no_load)
    monkeypatch.setattr(posswap.loading, "load_sentence_transformer", no_load)
    before = tree(tmp_path)
    code = main(["export", str(rope_folder), "--out", str(tmp_path / "out"), "--format", format])
    err = capsys.readouterr().err
    assert_one_line_error(code, err, expected)
    assert "again" in err  # what to do
    assert tree(tmp_path) == before


# -- 9. posswap export --format onnx without the onnx extra ---------------------------------------------------------


def test_onnx_export_without_the_onnx_extra_names_the_extra(tmp_path):
    folder = tmp_path / "bert"
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    transformers.BertModel(config).save_pretrained(folder)
    done = python(
        "import sys\nsys.modules['onnx'] = None  # not installed\nfrom posswap.cli import main\n"
        f"sys.exit(main(['export', {str(folder)!r}, '--format', 'onnx', '--out', {str(tmp_path / 'out')!r}]))\n"
    )
    assert_one_line_error(done.returncode, done.stderr, "pip install 'posswap[onnx]'")
    assert "onnx is missing" in done.stderr and not (tmp_path / "out").exists()


# -- 12. examples/late_chunk_index.py: one line, not a traceback ---------------------------------------------------


@pytest.fixture
def example(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    import late_chunk_index

    return late_chunk_index


def test_the_lancedb_example_says_what_to_do_in_one_line(example, tmp_path, capsys, monkeypatch):
    (tmp_path / "docs").mkdir()
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "lancedb", None)  # not installed
        code = example.main(["index", "posswap:minilm", str(tmp_path / "docs"), str(tmp_path / "db")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("late_chunk_index.py: error:") and "pip install 'posswap[vectordb]'" in err
    pytest.importorskip("lancedb")
    code = example.main(["search", str(tmp_path / "no-model"), str(tmp_path / "db"), "Who kept bees?"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "no-model" in err and "does not exist" in err
    assert not (tmp_path / "db").exists()


# -- 13. one rule for lengths past what the models read, in every retrieval task ---------------------------------


def test_every_retrieval_task_refuses_a_length_far_past_the_model_before_building_documents(
    tmp_path, capsys, monkeypatch, minilm_path
):
    from posswap.embeddings import context_retrieval, retrieval

    def no_documents(*args, **kwargs):
        raise AssertionError("documents were built")

    for module, name in ((context_retrieval, "build_context_task"), (retrieval, "build_tasks")):
        monkeypatch.setattr(module, name, no_documents)
    lines = []
    for task in ("passkey-retrieval", "needle-retrieval", "context-retrieval"):
        flags = ["--task", task, "--lengths", "100000", "--documents", "8", "--out", str(tmp_path / "report")]
        code = main(["eval", minilm_path, *flags])
        err = "\n".join(line for line in capsys.readouterr().err.splitlines() if line and "%|" not in line)
        assert_one_line_error(code, err, "--lengths: 100000 tokens is over 16 times the most any model reads")
        lines.append(err)
    assert len(set(lines)) == 1  # the same rule, in the same words
    assert not (tmp_path / "report").exists()


def test_the_library_refuses_the_same_length_as_the_command_line_for_every_task(monkeypatch, minilm_path):
    """API and CLI refuse the same things: evaluate_retrieval and evaluate_context, before any document is built."""
    from sentence_transformers import SentenceTransformer

    from posswap.embeddings import context_retrieval, retrieval

    def no_documents(*args, **kwargs):
        raise AssertionError("documents were built")

    for module, name in ((context_retrieval, "build_context_task"), (retrieval, "build_tasks")):
        monkeypatch.setattr(module, name, no_documents)
    models = {"stock": SentenceTransformer(minilm_path, device="cpu")}
    expected = "lengths: 100000 tokens is over 16 times the most any model reads"
    with pytest.raises(ValueError, match=expected):
        retrieval.evaluate_retrieval(models, "passkey", [100000], documents=8, progress=False)
    with pytest.raises(ValueError, match=expected):
        context_retrieval.evaluate_context(models, [100000], documents=8, progress=False)
