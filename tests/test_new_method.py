"""A method from outside posswap, defined in this file alone: its config (rules in field metadata), checks, weight
change and run time register through ``register_method`` and ``posswap_registry.installer``, and posswap patches,
saves and loads it as one of its own; the registration is undone after each test.

What a saved folder carries is posswap's own run-time code (``portable/``): a method registered from outside is
not in it, so ``trust_remote_code=True`` without posswap refuses the folder, naming the method and how to load it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import torch
from conftest import OLD_LENGTH, make_model, outputs, run_without_posswap, sharpen_qk, token_ids

import posswap
from posswap.absolute import replace_table_weight
from posswap.portable import posswap_registry
from posswap.portable.posswap_functional import resample_positions
from posswap.portable.posswap_interpolate import learned_map
from posswap.portable.posswap_rules import number
from posswap.registry import METHODS, register_method, unregister_method

NAME = "scaled-table"  # the learned table extended by copy, its rows scaled at run time by `factor`
NEW_LENGTH = 2 * OLD_LENGTH


@dataclass
class ScaledTableConfig(posswap.PositionConfig):
    method = NAME

    factor: float = field(
        default=0.5, metadata={"help": "What the table's rows are multiplied by.", "rule": number(above=0)}
    )


def check(model, sites, config: ScaledTableConfig) -> None:
    if sites.table is None:
        raise ValueError("scaled-table scales the learned position table, and this model has none left.")


def apply(model, sites, config: ScaledTableConfig) -> None:
    weight = resample_positions(sites.table.weight.detach(), sites.offset, config.max_length, "copy")
    replace_table_weight(sites.table, weight)


def scale_rows(factor: float):
    def hook(module, inputs, output):
        return output * factor

    return hook


def install(model, sites, block: dict) -> None:
    """The run time: a forward hook on the (kept) table. No parameter, so the weights are the table's alone."""
    table = getattr(sites.owner, sites.arch.table)
    if not getattr(table, "scaled_by_posswap_test", False):
        table.register_forward_hook(scale_rows(float(block["factor"])))
        table.scaled_by_posswap_test = True


@pytest.fixture
def scaled_method():
    posswap_registry.installer(NAME, keeps_table=True)(install)
    spec = register_method(
        ScaledTableConfig,
        check,
        apply,
        variants={NAME: {}},
        extends_table=True,
        position_map=learned_map,
        example=lambda n: ScaledTableConfig(max_length=n),
    )
    yield spec
    unregister_method(NAME)
    assert NAME not in METHODS and NAME not in posswap_registry.INSTALLERS and NAME not in posswap_registry.SCHEMAS


def test_the_throwaway_method_round_trips(scaled_method, tmp_path):
    model = sharpen_qk(make_model("gpt2", "GPT2LMHeadModel"))
    ids = token_ids(NEW_LENGTH)
    stock = outputs(model, ids[:, :OLD_LENGTH]).detach()
    patched = posswap.patch(model, posswap.config_from_dict({"method": NAME, "max_length": NEW_LENGTH, "factor": 0.25}))
    with torch.no_grad():
        expected = outputs(patched, ids)
    assert not torch.allclose(expected[:, :OLD_LENGTH], stock, atol=1e-3)  # the run time ran: rows scaled
    patched.save_pretrained(tmp_path / "saved")
    block = json.loads((tmp_path / "saved" / "config.json").read_text())["posswap"]
    assert block["method"] == NAME and block["factor"] == 0.25 and block["max_length"] == NEW_LENGTH

    loaded = posswap.from_pretrained(str(tmp_path / "saved")).eval()
    with torch.no_grad():
        assert torch.equal(outputs(loaded, ids), expected)

    # Without posswap: the folder's code is posswap's own, which does not know this method; it says so.
    script = """
import sys, transformers
try:
    transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
    print("loaded")
except ValueError as error:
    print(error)
"""
    said = run_without_posswap(script, str(tmp_path / "saved"), modules=tmp_path / "modules").strip().splitlines()[-1]
    assert f"the 'posswap' block has method {NAME!r}, which this code does not know" in said, said
    assert "A method registered outside posswap is not carried in saved folders" in said, said
    assert "posswap.from_pretrained where that method is registered" in said, said


def test_the_throwaway_method_is_checked_by_its_own_rules(scaled_method, tmp_path):
    with pytest.raises(ValueError, match="factor must be a number > 0, got 0"):
        posswap.config_from_dict({"method": NAME, "max_length": NEW_LENGTH, "factor": 0})
    model = posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), ScaledTableConfig(max_length=NEW_LENGTH))
    model.save_pretrained(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    config["posswap"]["factor"] = -1
    (tmp_path / "saved" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"block \({NAME}\) key 'factor' must be a finite number > 0; got -1"):
        posswap.from_pretrained(str(tmp_path / "saved"))


def test_the_other_tests_do_not_see_it():
    assert NAME not in METHODS and NAME not in posswap_registry.INSTALLERS and NAME not in posswap_registry.SCHEMAS
