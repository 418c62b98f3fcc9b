"""Reliability of a method registered from outside posswap (issue 45): a refused ``register_method`` leaves nothing
registered, whichever step refused it and whatever its run-time module registered first; a run-time file that is
missing, does not compile, or fails where a saved folder loads it (posswap not installed) is refused in one line
naming it. And ``posswap eval --task passkey-retrieval`` refuses lengths no model reads before it builds any text.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from conftest import WITHOUT_POSSWAP
from test_new_method import NAME, RUNTIME, assert_forgotten, register

import posswap
from posswap import cli
from posswap.embeddings import retrieval
from posswap.embeddings.retrieval import evaluate_retrieval
from posswap.portable import posswap_registry
from posswap.portable.posswap_rules import check as check_rule
from posswap.registry import METHODS, register_method, unregister_method

DECOY = "decoy-table"  # a second throwaway method, whose bad run-time files register under other names


@dataclass
class DecoyConfig(posswap.PositionConfig):
    method = DECOY


@dataclass
class CheckedDecoyConfig(posswap.PositionConfig):
    """A key whose rule names a block check that its run-time module does not register."""

    method = DECOY
    limit: int = field(default=1, metadata={"help": "A bound.", "rule": check_rule("decoy_limit_problem")})


def register_decoy(runtime, config_class=DecoyConfig):
    return register_method(config_class, lambda *a: None, lambda *a: None, variants={DECOY: {}}, runtime_module=runtime)


def registries() -> dict:
    """Every registry table, copied: what a refused registration must leave as it found it."""
    tables = ("INSTALLERS", "RUNTIME_CODE", "SCHEMAS", "BLOCK_CHECKS", "KEEPS_TABLE", "CARRIED")
    state = {name: getattr(posswap_registry, name).copy() for name in tables}
    return state | {"METHODS": METHODS.copy(), "modules": {m for m in sys.modules if m.startswith("posswap.")}}


def refused(runtime, config_class=DecoyConfig) -> str:
    """The one line ``register_method`` refuses ``runtime`` with, after checking that nothing changed."""
    before = registries()
    with pytest.raises(ValueError) as error:
        register_decoy(runtime, config_class)
    said = str(error.value)
    assert "\n" not in said and DECOY in said, said
    assert registries() == before
    return said


INSTALLER = """
from .posswap_registry import installer

@installer({name!r})
def install_{index}(model, sites, block):
    pass
"""


def installers(*names: str) -> str:
    return "from __future__ import annotations\n" + "".join(
        INSTALLER.format(name=name, index=i) for i, name in enumerate(names)
    )


def test_a_module_registering_another_methods_installer_leaves_nothing_and_that_method_registers_later(tmp_path):
    runtime = tmp_path / "decoy_runtime.py"
    runtime.write_text(installers(NAME))  # scaled-table's installer, in the decoy's file
    said = refused(runtime)
    assert said.startswith(f"register_method({DECOY!r}): runtime_module {runtime} registers no installer for "), said
    assert f"registers no installer for {DECOY!r} (it registers {NAME!r})" in said, said
    assert NAME not in posswap_registry.INSTALLERS
    register(runtime_module=RUNTIME)  # the real scaled-table registers: nothing of the decoy's stands in the way
    assert posswap_registry.INSTALLERS[NAME].__module__ == "posswap.portable.new_method_runtime"
    unregister_method(NAME)
    assert_forgotten()


def test_a_module_registering_its_own_and_another_methods_installer_is_refused(tmp_path):
    runtime = tmp_path / "decoy_runtime.py"
    runtime.write_text(installers(DECOY, NAME))
    said = refused(runtime)
    assert said.startswith(f"register_method({DECOY!r}): runtime_module {runtime} also registers installers for ")
    assert f"also registers installers for {NAME!r}; a runtime_module registers its own method's installer only" in said


def test_a_module_replacing_a_registered_installer_is_refused_and_the_installer_stays(tmp_path):
    rope = posswap_registry.INSTALLERS["rope"]
    runtime = tmp_path / "decoy_runtime.py"
    runtime.write_text(installers(DECOY, "rope"))  # passes in a fresh interpreter; here rope's is registered
    said = refused(runtime)
    assert said.startswith(f"register_method({DECOY!r}): runtime_module {runtime} fails when loaded: "), said
    assert "fails when loaded: ValueError: A run-time installer for method 'rope' is already registered." in said
    assert "(line " in said and posswap_registry.INSTALLERS["rope"] is rope


def test_a_refusal_after_the_module_loaded_undoes_what_it_registered(tmp_path):
    """The config names a block check the module does not register: refused after the module ran, which had
    registered its installer, a kept table and a block check of another name."""
    runtime = tmp_path / "decoy_runtime.py"
    runtime.write_text(
        "from .posswap_registry import block_check, installer\n\n"
        f"@installer({DECOY!r}, keeps_table=True)\ndef install(model, sites, block):\n    pass\n\n"
        "@block_check\ndef decoy_stray_problem(value, block):\n    return None\n"
    )
    said = refused(runtime, CheckedDecoyConfig)
    assert "names block checks nobody registered: decoy_limit_problem" in said, said
    assert "decoy_stray_problem" not in posswap_registry.BLOCK_CHECKS and DECOY not in posswap_registry.KEEPS_TABLE


def test_a_runtime_file_that_does_not_exist_is_refused_naming_it(tmp_path):
    missing = tmp_path / "nowhere_runtime.py"
    said = refused(missing)
    assert said == (
        f"register_method({DECOY!r}): runtime_module {missing} does not exist; give the path of the method's "
        "run-time .py file."
    )


def test_a_runtime_file_that_does_not_compile_is_one_line_naming_file_and_line(tmp_path):
    runtime = tmp_path / "late_future_runtime.py"
    runtime.write_text("x = 1\nfrom __future__ import annotations\n")  # parses; only the compiler refuses it
    said = refused(runtime)
    assert said == (
        f"register_method({DECOY!r}): runtime_module {runtime} does not compile: from __future__ imports must occur "
        "at the beginning of the file (line 2)."
    )


DYNAMIC = """import importlib

from .posswap_registry import installer

tools = importlib.import_module("pos" + "swap")


@installer({name!r})
def install(model, sites, block):
    pass
"""


def test_a_dynamic_import_of_posswap_is_refused_as_a_saved_folder_would_fail(tmp_path):
    runtime = tmp_path / "dynamic_runtime.py"
    runtime.write_text(DYNAMIC.format(name=DECOY))
    said = refused(runtime)
    assert said.startswith(
        f"register_method({DECOY!r}): runtime_module {runtime} fails to load where posswap is not installed, as in "
        "a saved folder: ModuleNotFoundError: No module named 'posswap'"
    ), said
    assert "(line 5)" in said and "import only torch, transformers, the standard library" in said
    # The reference: the file as a saved folder's code loads it, posswap not importable, fails the same way.
    script = WITHOUT_POSSWAP + (
        "import importlib.util, sys, types\n"
        "package = types.ModuleType('folder'); package.__path__ = [sys.argv[1]]; sys.modules['folder'] = package\n"
        "spec = importlib.util.spec_from_file_location('folder.dynamic_runtime', sys.argv[2])\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
    )
    portable = str(Path(posswap_registry.__file__).parent)
    done = subprocess.run([sys.executable, "-c", script, portable, str(runtime)], capture_output=True, text=True)
    assert done.returncode != 0 and "posswap is not installed here" in done.stderr


class Reader:
    """An encoder that reads ``max_seq_length`` tokens: a constant vector (what it says does not matter here)."""

    def __init__(self, limit: int):
        self.max_seq_length = limit

    def encode(self, texts, batch_size=8, convert_to_tensor=True, show_progress_bar=False):
        return torch.ones(len(texts), 4)


def no_text(*args, **kwargs):
    raise AssertionError("text was built")


def test_lengths_past_what_any_model_reads_are_refused_before_any_text(monkeypatch, minilm_path):
    monkeypatch.setattr(retrieval, "build_tasks", no_text)
    with pytest.raises(ValueError) as error:
        evaluate_retrieval(
            {"short": Reader(64), "shorter": Reader(32)}, lengths=[128, 2048], documents=2, tokenizer=minilm_path
        )
    assert str(error.value) == (
        "lengths: 2048 tokens is over 16 times the most any model reads of a document (64 tokens, the "
        "max_seq_length of short), so the text past that would be built for no reader; give lengths up to 1024, "
        "or add a baseline that reads whole documents (chunk-mean, chunk-max, late-chunk-max)."
    )


def test_lengths_up_to_the_bound_or_with_whole_document_baselines_pass_the_check(minilm_path):
    results = evaluate_retrieval({"short": Reader(64)}, lengths=[128, 1024], documents=2, tokenizer=minilm_path)
    assert results.lengths == [128, 1024] and results.models["short"].limit == 64
    retrieval.check_lengths_read({"short": Reader(64)}, ["chunk-max"], [1 << 20])  # the chunks read it all
    retrieval.check_lengths_read({"unknown": object()}, [], [1 << 20])  # no limit known: the cost rule alone


def test_cli_refuses_a_length_far_past_the_model_before_building_text(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(retrieval, "build_tasks", no_text)
    monkeypatch.setattr(retrieval, "build_task", no_text)
    out = tmp_path / "report"
    argv = ["eval", "posswap:minilm", "--task", "passkey-retrieval", "--lengths", "16777216", "--documents", "2"]
    assert cli.main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error" in line]  # not transformers' progress bar
    assert len(errors) == 1 and errors[0].startswith("posswap eval: error: --lengths: 16777216"), err
    assert "--lengths: 16777216 tokens is over 16 times the most any model reads" in err, err
    assert "(256 tokens, the max_seq_length of minilm)" in err and "give lengths up to 4096" in err, err
    assert not out.exists()


def test_the_registries_are_as_they_were():
    assert_forgotten()
    assert DECOY not in METHODS and DECOY not in posswap_registry.INSTALLERS and DECOY not in posswap_registry.SCHEMAS
