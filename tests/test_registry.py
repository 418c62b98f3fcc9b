"""One registration per method: ``register_method`` in the method's own file gives everything the rest of posswap
needs, and the parts keyed by the method's name elsewhere are there, or a test fails naming what is missing."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from test_common import FACTORIES

import posswap
from posswap import cli
from posswap.portable import posswap_block, posswap_runtime
from posswap.registry import METHODS, MethodSpec, register_method, study_variants
from posswap.study import copying, pictures, plan


def missing_parts(spec: MethodSpec) -> list[str]:
    """What a registered method lacks, each named with the place to add it."""
    missing = []
    if spec.name not in posswap_runtime.INSTALLERS:
        missing.append("a run-time installer in posswap/portable/posswap_runtime.py INSTALLERS")
    if spec.name not in posswap_block._KEYS:
        missing.append("its saved keys in posswap/portable/posswap_block.py _KEYS")
    if spec.name not in pictures.POSITION_MAPS:
        missing.append("a position map in posswap/study/pictures.py POSITION_MAPS")
    if spec.name not in FACTORIES:
        missing.append("a config factory in tests/test_common.py FACTORIES")
    if not spec.variants:
        missing.append("study variants (variants= in its register_method)")
    return missing


@pytest.mark.parametrize("name", METHODS)
def test_a_registered_method_has_every_part(name):
    missing = missing_parts(METHODS[name])
    assert not missing, f"method {name!r} is registered but lacks: {'; '.join(missing)}"


def test_the_keyed_tables_hold_registered_methods_only():
    for table, where in (
        (posswap_runtime.INSTALLERS, "posswap_runtime.INSTALLERS"),
        (posswap_block._KEYS, "posswap_block._KEYS"),
        ({k: v for k, v in pictures.POSITION_MAPS.items() if k != "learned"}, "pictures.POSITION_MAPS"),
        (FACTORIES, "tests/test_common.FACTORIES"),
    ):
        stray = sorted(set(table) - set(METHODS))
        assert not stray, f"{where} has {stray}, which no register_method registers"


def test_a_method_without_a_part_is_named(monkeypatch):
    spec = METHODS["alibi"]
    monkeypatch.delitem(posswap_runtime.INSTALLERS, "alibi")
    monkeypatch.delitem(pictures.POSITION_MAPS, "alibi")
    assert missing_parts(spec) == [
        "a run-time installer in posswap/portable/posswap_runtime.py INSTALLERS",
        "a position map in posswap/study/pictures.py POSITION_MAPS",
    ]


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
