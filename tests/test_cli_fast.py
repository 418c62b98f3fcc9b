"""The command line answers at once: ``posswap --help`` and every command's ``--help`` import neither torch nor
transformers and cost under 1.5 s of CPU; ``import posswap`` imports nothing heavy; the facts the parsers show of
the library (``posswap/cli/facts.py``) are those the library has now."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from posswap.cli import generate

ROOT = Path(__file__).parents[1]
COMMANDS = ("patch", "demo", "eval", "train", "study", "push", "export")
HELP_CPU_SECONDS = 1.5  # issue 46: the front door answers at once (it was about 7.5 s)
HEAVY = ("torch", "transformers", "sentence_transformers", "datasets", "accelerate")


def run_python(code: str) -> tuple[str, float]:
    """stdout of ``python -c code`` in a fresh process, and the CPU seconds (user + system) it used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done.stdout, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_the_facts_the_parsers_show_are_current():
    assert generate.FACTS_FILE.read_text(encoding="utf-8") == generate.render(), (
        f"posswap/cli/facts.py is stale: run {generate.COMMAND}"
    )


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_imports_no_torch_and_answers_at_once(command):
    argv = ["--help"] if command is None else [command, "--help"]
    code = (
        "import contextlib, io, sys\n"
        "from posswap.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as text, contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})\n"
        f"print(len(text.getvalue()), [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out, cpu = run_python(code)
    length, heavy = out.split(" ", 1)
    assert int(length) > 200 and heavy.strip() == "[]", out
    assert cpu < HELP_CPU_SECONDS, f"posswap {' '.join(argv)} took {cpu:.2f} s of CPU (limit {HELP_CPU_SECONDS})"


def test_import_posswap_imports_nothing_heavy_until_a_name_is_used():
    code = (
        "import sys, posswap\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules], end=' ')\n"
        "posswap.RopeConfig\n"
        "print('torch' in sys.modules, 'datasets' in sys.modules)\n"
    )
    out, _ = run_python(code)
    assert out.split() == ["[]", "True", "False"], out
