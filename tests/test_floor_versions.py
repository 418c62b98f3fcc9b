"""The dependency range pyproject.toml declares is the range CI tests: every installed direct dependency is inside
its range, and in CI's floor environment (``.ci/run`` installs it with uv's lowest-direct resolution and sets
``POSSWAP_FLOOR_RUN=1``) each one is exactly at its floor, so a floor no install can reach (one below what the
others require) fails here instead of being declared untested."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = Path(__file__).parents[1] / "pyproject.toml"


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    wanted = project["dependencies"] + project["optional-dependencies"]["test"]
    return [Requirement(line) for line in wanted if not line.startswith(("pytest", "setuptools"))]


def floor(requirement: Requirement) -> Version:
    floors = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert floors, f"{requirement} declares no floor (>=) in pyproject.toml"
    return max(floors)


@pytest.mark.parametrize("requirement", direct_requirements(), ids=str)
def test_installed_version_is_in_the_declared_range(requirement):
    installed = Version(importlib.metadata.version(requirement.name))
    # A local build tag (torch's +cpu) is the same release.
    assert requirement.specifier.contains(Version(installed.public), prereleases=True), (requirement, installed)
    if os.environ.get("POSSWAP_FLOOR_RUN") == "1" and requirement.specifier:  # no range: any version will do
        assert Version(installed.public) == floor(requirement), (
            f"{requirement.name} {installed} installed where pyproject.toml's floor is {floor(requirement)}: raise the "
            "floor to the lowest version that installs beside the others"
        )
