"""A method is its two modules, its docs page and its tests (issue 46). A throwaway method written into a copy of the
repository (``posswap/methods/throwaway.py``, ``posswap/portable/posswap_throwaway.py``, ``docs/methods/throwaway.md``)
with no other file edited is, once ``python -m posswap.cli.generate --write`` has written the generated files,
registered with every part, exported as ``posswap.ThrowawayConfig``, on the command line, in the docs' nav and in
the API reference: the registry, schema, docs and reference checks pass on the copy."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COPIED = ("posswap", "docs", "tools", "tests", "mkdocs.yml", "CONTRIBUTING.md", "CHANGELOG.md", "README.md")
# What a generator may write; everything else in the copy stays as it was.
# README.md: its families line names the methods a family with its own attention gets (the throwaway is one).
GENERATED = {
    "posswap/cli/facts.py",
    "posswap/portable/posswap_schema.py",
    "posswap/portable/posswap_methods.py",
    "README.md",
    "docs/methods/index.md",  # the method tables (README too): a row per registered method, from its page
}

METHOD = '''
"""``throwaway``: a test's method (no positions, as nope), to show a method needs no file but its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import PositionConfig
from ..portable.posswap_rules import boolean
from ..portable.posswap_throwaway import throwaway_map
from ..registry import register_method


@dataclass
class ThrowawayConfig(PositionConfig):
    method = "throwaway"

    loud: bool = field(default=False, metadata={"help": "Say so when patching.", "rule": boolean()})


def check(model, sites, config: ThrowawayConfig) -> None:
    """Nothing to refuse."""


def apply(model, sites, config: ThrowawayConfig) -> None:
    """No weight change."""


register_method(
    ThrowawayConfig,
    check,
    apply,
    variants={"throwaway": {}},
    position_map=throwaway_map,
    example=lambda n: ThrowawayConfig(max_length=n),
)
'''

RUNTIME = '''
"""``throwaway`` at run time: nothing added (the table is dropped, as for nope). Imports nothing from posswap."""

from __future__ import annotations

from .posswap_registry import installer


@installer("throwaway")
def install_throwaway(model, sites, block: dict) -> None:
    """Nothing to add."""


def throwaway_map(model, sites, positions) -> None:
    """No position representation to draw."""
'''

PAGE = """---
row: 8
what: "nothing: a test's method"
table: 'dropped'
pick: 'never'
---
# throwaway

A test's method.

<!-- posswap:options ThrowawayConfig -->
"""

CHECKS = """
import sys
import posswap
from posswap.cli import build_parser
from posswap.registry import registered
from tools import mkdocs_hooks as hooks

spec = registered()["throwaway"]
assert "ThrowawayConfig" in posswap.__all__ and posswap.ThrowawayConfig is spec.config_class
patch_help = next(a for a in build_parser()._actions if a.dest == "command").choices["patch"].format_help()
assert "--method throwaway:" in patch_help and "Say so when patching." in patch_help, patch_help
assert {"throwaway": "methods/throwaway.md"} in hooks.method_pages()
config = {"nav": [{"Methods": [{"Choosing a method": "methods/index.md"}]}]}
assert {"throwaway": "methods/throwaway.md"} in hooks.on_config(config)["nav"][0]["Methods"]
assert "| [`throwaway`](docs/methods/throwaway.md) | nothing: a test's method | never |" in open("README.md").read()
assert "| [`throwaway`](throwaway.md) | `ThrowawayConfig` | nothing: a test's method |" in open("docs/methods/index.md").read()
reference = hooks.on_page_markdown(open("docs/reference.md").read(), None, None, None)
assert "::: posswap.methods.throwaway.ThrowawayConfig" in reference and "| `loud` |" in reference
print("ok")
"""


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def run(args: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    """A copy of the repository with the throwaway method's three files added and the generated files written."""
    root = tmp_path_factory.mktemp("repository")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.png", "*.pyc"))
        else:
            shutil.copy2(source, root / name)
    before = digests(root)
    (root / "posswap" / "methods" / "throwaway.py").write_text(textwrap.dedent(METHOD).lstrip())
    (root / "posswap" / "portable" / "posswap_throwaway.py").write_text(textwrap.dedent(RUNTIME).lstrip())
    (root / "docs" / "methods" / "throwaway.md").write_text(PAGE)
    done = run([sys.executable, "-m", "posswap.cli.generate", "--write"], root)
    assert done.returncode == 0, done.stderr
    after = digests(root)
    changed = {name for name in after if before.get(name) != after[name]}
    added = {"posswap/methods/throwaway.py", "posswap/portable/posswap_throwaway.py", "docs/methods/throwaway.md"}
    assert changed - added <= GENERATED, f"files other than the generated ones changed: {changed - added - GENERATED}"
    assert GENERATED <= changed  # the method is in each generated file
    return root


def test_the_throwaway_method_is_registered_exported_on_the_cli_and_in_the_docs(repository):
    done = run([sys.executable, "-c", CHECKS], repository)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_registry_schema_docs_and_reference_checks_pass_with_it(repository):
    tests = [
        "tests/test_registry.py",
        "tests/test_cli_fast.py::test_the_facts_the_parsers_show_are_current",
        "tests/test_docs.py::test_every_public_name_is_in_the_api_reference",
        "tests/test_docs.py::test_every_method_has_a_page_with_its_options_table",
        "tests/test_common.py::test_every_registered_method_has_a_factory",
    ]
    done = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", *tests], repository)
    assert done.returncode == 0, done.stdout[-3000:]
    assert (
        "throwaway"
        in run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "--collect-only", tests[0]],
            repository,
        ).stdout
    )
