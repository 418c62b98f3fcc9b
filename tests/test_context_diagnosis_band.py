"""tools/context_diagnosis.py's ``--band``: transformers' SDPA with keys further than the band masked out, checked
against softmax attention computed by hand; a bad ``--band`` or a folder that is no model is one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def diagnosis():
    spec = importlib.util.spec_from_file_location("context_diagnosis", ROOT / "tools" / "context_diagnosis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_banded_attention_is_softmax_over_the_band_by_hand():
    torch.manual_seed(0)
    query, key, value = (torch.randn(1, 2, 7, 4) for _ in range(3))
    padding = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    padding[..., 6] = False  # the last token is padding
    module = torch.nn.Module()
    module.is_causal = False
    out, _ = diagnosis().banded_sdpa(2)(module, query, key, value, padding, scaling=0.5)
    distance = torch.arange(7)[:, None] - torch.arange(7)[None, :]
    keep = (distance.abs() <= 2) & padding[0, 0]
    logits = (query @ key.transpose(-1, -2) * 0.5).masked_fill(~keep, float("-inf"))
    expected = (logits.softmax(-1) @ value).transpose(1, 2)  # transformers returns (batch, tokens, heads, dim)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "argv,message",
    [(["--band", "0"], "--band must be 1 token or more, got 0"), ([], "is not a sentence-transformers folder")],
)
def test_bad_input_is_one_line_before_any_model_loads(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        diagnosis().main([str(tmp_path), *argv])
    assert message in capsys.readouterr().err


def test_out_writes_the_lines_printed(tmp_path, capsys, minilm_path):
    out = tmp_path / "diagnosis.json"
    diagnosis().main([str(minilm_path), "--length", "384", "--documents", "4", "--out", str(out)])
    printed = dict(line.rsplit(maxsplit=1) for line in capsys.readouterr().out.splitlines()[:-2])
    record = __import__("json").loads(out.read_text())
    (line,) = record["lines"]
    assert line["queries"] > 0 and abs(sum(line["first_hits"].values()) - 1) < 1e-9
    assert {where.strip(): f"{share:.2f}" for where, share in line["first_hits"].items()} == {
        where.strip(): share for where, share in printed.items()
    }
    assert record["length"] == 384 and record["command"].endswith(f"--out {out}")


def test_out_must_be_a_json_file_in_a_folder_that_exists(tmp_path, capsys):
    with pytest.raises(SystemExit):
        diagnosis().main([str(tmp_path), "--out", str(tmp_path / "no" / "such.json")])
    assert "--out must be a .json file in a folder that exists" in capsys.readouterr().err
