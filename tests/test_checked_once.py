"""Work done once (issue 46): a saved block's rules run once on every path that loads or builds a model (the
loader, the model class and the run time share one checked block), and ``posswap.patch`` finds the model's sites
once. Counted by wrapping the functions that do the work."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import make_model, token_ids

import posswap
from posswap.portable import posswap_architectures, posswap_block


@pytest.fixture
def rule_runs(monkeypatch) -> list[str]:
    """The methods whose block rules ran, one entry per run."""
    runs, original = [], posswap_block._check_rules

    def counted(block, where):
        runs.append(block["method"])
        return original(block, where)

    monkeypatch.setattr(posswap_block, "_check_rules", counted)
    return runs


@pytest.mark.parametrize(
    "config",
    [posswap.RopeConfig(max_length=64), posswap.InterpolateConfig(max_length=64), posswap.AlibiConfig(max_length=64)],
    ids=lambda c: c.method,
)
def test_a_saved_block_is_checked_once_per_load(config, tmp_path, rule_runs):
    model = make_model("bert", "BertModel")
    posswap.patch(model, config)
    model.save_pretrained(tmp_path)
    ids = token_ids(40)
    with torch.no_grad():
        before = model(input_ids=ids).last_hidden_state
    rule_runs.clear()
    loaded = posswap.from_pretrained(str(tmp_path))
    assert rule_runs == [config.method]
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).last_hidden_state, before)


def test_a_block_edited_after_its_check_is_checked_again(rule_runs):
    model = make_model("bert", "BertModel")
    posswap.patch(model, posswap.RopeConfig(max_length=64))
    block = posswap_block.checked_block(model.config.posswap, "here", model.config)
    runs = len(rule_runs)
    assert posswap_block.checked_block(block, "here", model.config) is block and len(rule_runs) == runs
    block["theta"] = -1.0  # edited in place: no longer what was checked
    with pytest.raises(ValueError, match="'theta'"):
        posswap_block.checked_block(block, "here", model.config)
    model.config.max_position_embeddings = 100  # a checked block still has its length compared with the config
    with pytest.raises(ValueError, match="max_length"):
        posswap_block.checked_block(posswap_block.CheckedBlock(model.config.posswap), "here", model.config)


def test_patch_finds_the_sites_once(monkeypatch, rule_runs):
    # find_stacks resolves a model's sites (find_sites is its first stack and calls it): counted wherever it is.
    calls, original = [], posswap_architectures.find_stacks

    def counted(model):
        calls.append(type(model).__name__)
        return original(model)

    for module in [m for name, m in sys.modules.items() if name.startswith("posswap") and m is not None]:
        if getattr(module, "find_stacks", None) is original:
            monkeypatch.setattr(module, "find_stacks", counted)
    model = make_model("gpt2", "GPT2LMHeadModel")
    posswap.patch(model, posswap.AlibiConfig(max_length=64))
    assert calls == ["GPT2LMHeadModel"] and rule_runs == ["alibi"]
