"""A method from outside posswap, defined in the tests alone: its config (rules in field metadata), checks and
weight change here, its run time in ``new_method_runtime.py`` (``register_method(..., runtime_module=...)``), and
posswap patches, saves and loads it as one of its own; the registration is undone after each test.

Its saved folder carries that run-time file beside posswap's own run-time code, so ``trust_remote_code=True``
without posswap loads it too. A method registered without its run-time file is not carried: without posswap its
folder is refused, naming the method and how to load it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import OLD_LENGTH, make_model, outputs, run_without_posswap, sharpen_qk, token_ids
from safetensors.torch import load_file, save_file

import posswap
from posswap.methods.absolute import replace_table_weight
from posswap.portable import posswap_registry
from posswap.portable.posswap_functional import resample_positions
from posswap.portable.posswap_interpolate import learned_map
from posswap.portable.posswap_rules import number
from posswap.registry import METHODS, register_method, unregister_method

NAME = "scaled-table"  # the learned table extended by copy, its rows scaled at run time by `factor`
NEW_LENGTH = 2 * OLD_LENGTH
RUNTIME = Path(__file__).with_name("new_method_runtime.py")  # what the method runs; its saved folders carry it


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


def register(**kwargs):
    return register_method(
        ScaledTableConfig,
        check,
        apply,
        variants={NAME: {}},
        extends_table=True,
        position_map=learned_map,
        example=lambda n: ScaledTableConfig(max_length=n),
        **kwargs,
    )


@pytest.fixture
def scaled_method():
    yield register(runtime_module=RUNTIME)
    unregister_method(NAME)
    assert_forgotten()


@pytest.fixture
def uncarried_method():
    """The method without its run-time file: an installer from this file (it only keeps the table), not carried."""
    posswap_registry.installer(NAME, keeps_table=True)(lambda model, sites, block: None)
    yield register()
    unregister_method(NAME)
    assert_forgotten()


def assert_forgotten():
    assert NAME not in METHODS and NAME not in posswap_registry.INSTALLERS and NAME not in posswap_registry.SCHEMAS
    assert NAME not in posswap_registry.CARRIED and "posswap.portable.new_method_runtime" not in sys.modules


# Without posswap: load the folder, save it again (its own code carries the method on), load that; both outputs.
WITHOUT = """
import sys, torch, transformers
from safetensors.torch import load_file, save_file
saved, resaved, exchange = sys.argv[1:4]
ids = load_file(exchange)["ids"]
model = transformers.AutoModelForCausalLM.from_pretrained(saved, trust_remote_code=True).eval()
model.save_pretrained(resaved)
again = transformers.AutoModelForCausalLM.from_pretrained(resaved, trust_remote_code=True).eval()
with torch.no_grad():
    save_file({"loaded": model(input_ids=ids).logits, "again": again(input_ids=ids).logits}, exchange)
print(type(model).__name__, sorted(p.name for p in __import__("pathlib").Path(resaved).glob("*.py")))
"""


def patched_and_saved(folder: Path):
    """The tiny GPT-2 patched with the method and saved in ``folder``; its inputs, outputs, and the stock outputs."""
    model = sharpen_qk(make_model("gpt2", "GPT2LMHeadModel"))
    ids = token_ids(NEW_LENGTH)
    stock = outputs(model, ids[:, :OLD_LENGTH]).detach()
    patched = posswap.patch(model, posswap.config_from_dict({"method": NAME, "max_length": NEW_LENGTH, "factor": 0.25}))
    with torch.no_grad():
        expected = outputs(patched, ids)
    patched.save_pretrained(folder)
    return ids, expected, stock


def test_the_throwaway_method_round_trips(scaled_method, tmp_path):
    ids, expected, stock = patched_and_saved(tmp_path / "saved")
    assert not torch.allclose(expected[:, :OLD_LENGTH], stock, atol=1e-3)  # the run time ran: rows scaled
    block = json.loads((tmp_path / "saved" / "config.json").read_text())["posswap"]
    assert block["method"] == NAME and block["factor"] == 0.25 and block["max_length"] == NEW_LENGTH
    assert (tmp_path / "saved" / RUNTIME.name).read_text() == RUNTIME.read_text()

    loaded = posswap.from_pretrained(str(tmp_path / "saved")).eval()
    with torch.no_grad():
        assert torch.equal(outputs(loaded, ids), expected)

    exchange = tmp_path / "exchange.safetensors"
    save_file({"ids": ids}, exchange)
    said = run_without_posswap(
        WITHOUT, str(tmp_path / "saved"), str(tmp_path / "resaved"), str(exchange), modules=tmp_path / "modules"
    )
    assert said.split()[0] == "PosswapGPT2LMHeadModel" and RUNTIME.name in said, said
    got = load_file(exchange)
    assert torch.allclose(got["loaded"], expected, atol=1e-6, rtol=0), (got["loaded"] - expected).abs().max()
    assert torch.equal(got["again"], got["loaded"])


def test_a_method_without_its_runtime_file_is_refused_without_posswap(uncarried_method, tmp_path):
    patched_and_saved(tmp_path / "saved")
    assert not (tmp_path / "saved" / RUNTIME.name).exists()
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
    assert "carried in saved folders only with its run-time file (register_method(..., runtime_module=path))" in said
    assert "posswap.from_pretrained where that method is registered" in said, said


@pytest.mark.parametrize(
    "source, says",
    [
        (
            "from posswap.portable.posswap_registry import installer\n",
            "imports posswap.portable.posswap_registry (the posswap package), which a folder loaded without posswap cannot; import posswap's run-time modules as `from .posswap_registry import installer`",
        ),
        ("import posswap\n", "imports posswap (the posswap package)"),
        (
            "from . import posswap_registry\n",
            "imports `from . import ...`, a form transformers does not copy into folders",
        ),
        (
            "from .helpers import f\n",
            "imports .helpers, which is none of posswap's run-time modules (posswap/portable)",
        ),
        (
            "from .posswap_block import check_block\n",
            "imports .posswap_block, which imports every method's run time itself",
        ),
        (
            "import torch\n",
            "registers no installer for 'scaled-table'; decorate its install function with @installer('scaled-table')",
        ),
    ],
)
def test_a_runtime_file_saved_folders_could_not_carry_is_refused(tmp_path, source, says):
    runtime = tmp_path / "throwaway_runtime.py"
    runtime.write_text(source)
    with pytest.raises(ValueError) as error:
        register(runtime_module=runtime)
    assert str(error.value).startswith(f"register_method({NAME!r}): "), error.value
    assert says in str(error.value) and "\n" not in str(error.value), error.value
    assert (
        NAME not in METHODS
        and NAME not in posswap_registry.INSTALLERS
        and "posswap.portable.throwaway_runtime" not in sys.modules
    )


def test_the_other_tests_do_not_see_it():
    assert_forgotten()
