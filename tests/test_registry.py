"""One registration per method: ``register_method`` in the method's own file gives everything the rest of posswap
needs, and the parts keyed by the method's name elsewhere are there, or a test fails naming what is missing."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from test_common import FACTORIES

import posswap
from posswap import cli, schema
from posswap.portable import posswap_registry, posswap_runtime
from posswap.registry import METHODS, MethodSpec, register_method, study_variants
from posswap.study import copying, plan


def missing_parts(spec: MethodSpec) -> list[str]:
    """What a registered method lacks, each named with the place to add it."""
    missing = []
    if spec.name not in posswap_runtime.INSTALLERS:
        missing.append(
            "a run-time installer (@posswap_registry.installer in its posswap/portable/posswap_<name>.py, "
            "imported by posswap/portable/posswap_methods.py)"
        )
    if spec.name not in posswap_registry.SCHEMAS:
        missing.append(f"its saved keys in posswap/portable/posswap_schema.py (run {schema.COMMAND})")
    if spec.position_map is None:
        missing.append("a position map (position_map= in its register_method)")
    if spec.name not in FACTORIES:
        missing.append("an example config (example= in its register_method)")
    if not spec.variants:
        missing.append("study variants (variants= in its register_method)")
    return missing


@pytest.mark.parametrize("name", METHODS)
def test_a_registered_method_has_every_part(name):
    missing = missing_parts(METHODS[name])
    assert not missing, f"method {name!r} is registered but lacks: {'; '.join(missing)}"


def test_the_keyed_tables_hold_registered_methods_only():
    for table, where in (
        (posswap_runtime.INSTALLERS, "posswap_registry.INSTALLERS"),
        (posswap_registry.SCHEMAS, "posswap_registry.SCHEMAS"),
        (FACTORIES, "tests/test_common.FACTORIES"),
    ):
        stray = sorted(set(table) - set(METHODS))
        assert not stray, f"{where} has {stray}, which no register_method registers"


def test_a_method_without_a_part_is_named(monkeypatch):
    spec = dataclasses.replace(METHODS["alibi"], position_map=None)
    monkeypatch.delitem(posswap_runtime.INSTALLERS, "alibi")
    assert missing_parts(spec) == [
        "a run-time installer (@posswap_registry.installer in its posswap/portable/posswap_<name>.py, "
        "imported by posswap/portable/posswap_methods.py)",
        "a position map (position_map= in its register_method)",
    ]


def test_the_portable_schema_is_generated_from_the_config_classes():
    """Saved models check their block with posswap_schema.py, written from the configs' field rules."""
    assert schema.SCHEMA_FILE.read_text(encoding="utf-8") == schema.render(), (
        f"posswap/portable/posswap_schema.py is stale: run {schema.COMMAND}"
    )
    assert schema.METHODS_FILE.read_text(encoding="utf-8") == schema.render_methods(), (
        f"posswap/portable/posswap_methods.py is stale: run {schema.COMMAND}"
    )
    assert posswap_registry.SCHEMAS["t5-bias"]["num_buckets"] == {
        "kind": "integer",
        "minimum": 4,
        "maximum": 65536,
        "required": True,
    }


@pytest.mark.parametrize("variant", plan.VARIANTS)
def test_every_study_variant_is_a_valid_config_of_its_method(variant):
    spec, keys = study_variants()[variant]
    block = plan.variant_patch(variant, 256)
    config = posswap.config_from_dict(block)
    assert config.method == spec.name and all(getattr(config, k) == v for k, v in keys.items())
    # Table methods are made for the trained 4x; the rest reach 8x (real extrapolation), as the study's design says.
    assert block["max_length"] == (4 if spec.extends_table else 8) * 256


def test_study_variants_come_from_the_registry_in_order():
    assert plan.VARIANTS == tuple(v for spec in METHODS.values() for v in spec.variants)
    assert plan.VARIANTS[:5] == ("copy", "linear", "cubic", "rope", "rope-yarn")  # the reports' order
    assert set(plan.VARIANTS) <= set(copying.COPYING_VARIANTS)


def test_cli_help_lists_the_study_variants_and_each_methods_own_options():
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    study = commands["study"].format_help()
    assert all(v in " ".join(study.split()) for v in plan.VARIANTS)
    patch = commands["patch"].format_help()
    for spec in METHODS.values():
        section = patch.split(f"--method {spec.name}:")[1].split("--method ")[0]
        for f in dataclasses.fields(spec.config_class):
            if f.name != "max_length":
                # its own text, under its own method: --backend of t5-bias is not ALiBi's text
                assert " ".join(f.metadata["help"].split())[:40] in " ".join(section.split()), (spec.name, f.name)


def test_registration_refuses_a_method_without_variants_or_with_a_taken_one():
    class Fake(posswap.PositionConfig):
        method = "fake"

    with pytest.raises(ValueError, match="needs study variants"):
        register_method(Fake, lambda *a: None, lambda *a: None, variants={})
    with pytest.raises(ValueError, match="taken"):
        register_method(Fake, lambda *a: None, lambda *a: None, variants={"rope": {}})
    assert "fake" not in METHODS


def shared_option_labels() -> dict[str, dict[str, list[str]]]:
    """Option name -> the label of its help (the words before the first colon) -> the methods saying it, for each
    option that several methods have."""
    labels: dict[str, dict[str, list[str]]] = {}
    for spec in METHODS.values():
        for f in dataclasses.fields(spec.config_class):
            label = f.metadata.get("help", "").split(":")[0]
            labels.setdefault(f.name, {}).setdefault(label, []).append(spec.name)
    return {name: by_label for name, by_label in labels.items() if sum(map(len, by_label.values())) > 1}


def test_an_option_several_methods_have_means_one_thing():
    """One name per idea: `posswap patch` has one flag per option name (--mode, --theta), so an option that
    several methods have names one idea in each, the label its help starts with."""
    shared = shared_option_labels()
    assert {"max_length", "mode", "theta", "absolute", "backend", "init"} <= set(shared)
    two = {name: by_label for name, by_label in shared.items() if len(by_label) > 1}
    assert not two, f"one option name, several meanings (rename the option of the other meaning): {two}"
    assert list(shared["theta"]) == ["Frequency base"] and list(shared["mode"]) == [
        "How the learned table grows to max_length"
    ]
