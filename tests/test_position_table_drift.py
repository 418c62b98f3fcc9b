"""tools/position_table_drift.py: a trained table against the one patching made from its base, by hand: an
untouched save moved nothing (so the reference is patched with the model's own placement), a known move is
measured as that move, and neighbouring rows' distances are the table's own."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import posswap

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = posswap.InterpolateConfig(
    max_length=128, mode="stride", exact_short_inputs=True, stride_per_length=True, stride_blocks=2
)


def drift_tool():
    spec = importlib.util.spec_from_file_location("position_table_drift", ROOT / "tools" / "position_table_drift.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_of(model) -> torch.nn.Parameter:
    return model[0].auto_model.embeddings.position_embeddings.weight


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_drift_against_the_table_patching_made(tmp_path, minilm_path):
    pytest.importorskip("sentence_transformers")
    from test_sentence_transformers import tiny_sentence_transformer

    base = tmp_path / "base"
    model = tiny_sentence_transformer(tmp_path / "weights", minilm_path)
    model.save(str(base))
    posswap.patch(model, BLOCKS)
    start = table_of(model).detach().clone()
    model.save(str(tmp_path / "untouched"))
    untouched = drift_tool().drift(str(tmp_path / "untouched"), str(base))
    for stretch in untouched["stretches"].values():
        assert stretch["moved_share"] == pytest.approx(0.0, abs=1e-6)

    torch.manual_seed(1)
    move = 0.05 * torch.randn_like(start)
    with torch.no_grad():
        table_of(model).add_(move)
    model.save(str(tmp_path / "trained"))
    result = drift_tool().drift(str(tmp_path / "trained"), str(base))
    stock = table_of(tiny_sentence_transformer(tmp_path / "again", minilm_path)).detach()  # the same seed: the base
    assert result["stock_rows"] == [6, 26]  # the middle three fifths of 32 rows
    by_hand = torch.stack([stock[i + 1] - stock[i] for i in range(6, 25)]).norm(dim=1).mean().item()
    assert result["stock_neighbours"] == pytest.approx(by_hand, rel=1e-5)
    end = start + move
    rest = slice(32, 128)  # the tiny base has 32 rows
    assert result["stretches"]["the rest"]["rows"] == [32, 128]
    expected_share = ((end[rest] - start[rest]).norm(dim=1) / start[rest].norm(dim=1)).mean().item()
    assert result["stretches"]["the rest"]["moved_share"] == pytest.approx(expected_share, rel=1e-5)
    before = torch.stack([start[i + 1] - start[i] for i in range(32, 127)]).norm(dim=1).mean().item()
    after = torch.stack([end[i + 1] - end[i] for i in range(32, 127)]).norm(dim=1).mean().item()
    assert result["stretches"]["the rest"]["neighbours_before"] == pytest.approx(before, rel=1e-5)
    assert result["stretches"]["the rest"]["neighbours_after"] == pytest.approx(after, rel=1e-5)


def test_a_stock_or_plain_transformers_model_is_one_line(tmp_path, minilm_path):
    pytest.importorskip("sentence_transformers")
    from test_sentence_transformers import tiny_sentence_transformer

    tiny_sentence_transformer(tmp_path / "weights", minilm_path).save(str(tmp_path / "base"))
    with pytest.raises(SystemExit, match="is not a posswap-patched model"):
        drift_tool().drift(str(tmp_path / "base"), str(tmp_path / "base"))
    with pytest.raises(SystemExit, match="is not a sentence-transformers model folder"):
        drift_tool().drift(str(tmp_path / "weights"), str(tmp_path / "base"))  # a transformers folder only
