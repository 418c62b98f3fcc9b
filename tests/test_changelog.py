"""CHANGELOG.md: Keep a Changelog's shape, an entry for the version posswap says it is, and a page of the site (its
links and CONTRIBUTING's to it work there)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

import posswap

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
VERSION = re.compile(r"^## (Unreleased|(\d+\.\d+\.\d+) - (Unreleased|\d{4}-\d{2}-\d{2}))$")
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")  # Keep a Changelog's


def sections() -> list[tuple[str, list[str]]]:
    """(each ``## `` heading, the ``### `` headings under it)."""
    found: list[tuple[str, list[str]]] = []
    for line in CHANGELOG.read_text().splitlines():
        if line.startswith("## "):
            found.append((line, []))
        elif line.startswith("### "):
            assert found, f"{line!r} comes before any version heading"
            found[-1][1].append(line[4:])
    return found


def test_each_release_heading_is_a_version_and_a_date_with_keep_a_changelogs_kinds():
    found = sections()
    assert found and CHANGELOG.read_text().startswith("# Changelog\n")
    for heading, kinds in found:
        assert VERSION.match(heading), (
            f"{heading!r}: '## X.Y.Z - YYYY-MM-DD', '## X.Y.Z - Unreleased' or '## Unreleased'"
        )
        assert kinds and all(kind in KINDS for kind in kinds), f"{heading}: {kinds} (allowed: {', '.join(KINDS)})"
        assert len(kinds) == len(set(kinds)), f"{heading}: a kind twice in {kinds}"


def test_the_current_version_has_an_entry():
    versions = [VERSION.match(heading).group(2) for heading, _ in sections()]
    assert posswap.__version__ in versions, f"CHANGELOG.md has no '## {posswap.__version__} - ...' heading"


def test_the_changelog_names_what_the_renames_table_renamed():
    from posswap.portable.posswap_block import RENAMED_KEYS

    text = CHANGELOG.read_text()
    for renames in RENAMED_KEYS.values():
        for old, new in renames.items():
            assert f"`{old}`" in text and f"`{new}`" in text, f"the rename {old} -> {new} is not in CHANGELOG.md"


def test_the_changelog_is_a_page_of_the_site_and_contributing_links_to_it():
    pytest.importorskip("mkdocs")  # the dev extra
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert "changelog.md" in re.findall(r"'([\w/-]+\.md)'", repr(nav))
    assert (ROOT / "docs" / "changelog.md").read_text().strip() == "<!-- posswap:include CHANGELOG.md -->"
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "tools" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    contributing = hooks.include("CONTRIBUTING.md")
    assert "](changelog.md)" in contributing and "](CHANGELOG.md)" not in contributing
    assert "](CHANGELOG.md)" in (ROOT / "CONTRIBUTING.md").read_text()  # on GitHub, the file itself
