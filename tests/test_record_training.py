"""tools/record_training.py: a run's training.json from its folder and its time log, or without one."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "record_training.py"
TIME_LOG = """\tCommand being timed: "posswap train recipe.yaml"
\tUser time (seconds): 100.50
\tSystem time (seconds): 19.50
\tPercent of CPU this job got: 187%
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:04.20
"""


def record(argv: list[str]) -> None:
    old = sys.argv
    sys.argv = [str(TOOL), *argv]
    try:
        runpy.run_path(str(TOOL), run_name="__main__")
    finally:
        sys.argv = old


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    recipe = {"train": {"batch_size": 8}, "embedding": {"document_lengths": [256, 512]}}
    (run / "recipe.json").write_text(json.dumps(recipe))
    (run / "log.jsonl").write_text("".join(json.dumps({"step": i, "loss": 1.0 / i}) + "\n" for i in (1, 2, 3)))
    return run


def test_a_timed_run_takes_the_time_log(run_dir, tmp_path):
    (tmp_path / "time.log").write_text(TIME_LOG)
    out = tmp_path / "training.json"
    record([str(run_dir), str(tmp_path / "time.log"), str(out), "--machine-note", "one thread"])
    written = json.loads(out.read_text())
    assert written["command"] == "posswap train recipe.yaml" and written["steps"] == 3
    assert written["wall_seconds"] == 64.2 and written["cpu_seconds"] == 120.0
    assert "of which the run got 187% (one thread)" in written["machine"]
    assert written["losses"] == [1.0, 0.5, 1.0 / 3]


def test_an_untimed_run_records_its_cpu_time_as_unknown(run_dir, tmp_path):
    out = tmp_path / "training.json"
    record([str(run_dir), "-", str(out), "--command", "posswap train x.yaml", "--wall-seconds", "90"])
    written = json.loads(out.read_text())
    assert written["command"] == "posswap train x.yaml" and written["wall_seconds"] == 90.0
    assert written["cpu_seconds"] is None and "of which" not in written["machine"]


def test_a_run_timed_by_bash_takes_its_real_user_and_sys(run_dir, tmp_path):
    (tmp_path / "bash.log").write_text("train: 100%|####| 3/3\n\nreal\t1m4.200s\nuser\t1m50.000s\nsys\t0m10.000s\n")
    out = tmp_path / "training.json"
    record([str(run_dir), str(tmp_path / "bash.log"), str(out), "--command", "posswap train r.yaml"])
    written = json.loads(out.read_text())
    assert written["command"] == "posswap train r.yaml" and written["wall_seconds"] == 64.2
    assert written["cpu_seconds"] == 120.0 and "of which the run got 187%" in written["machine"]
    with pytest.raises(SystemExit):  # bash's time does not name the command
        record([str(run_dir), str(tmp_path / "bash.log"), str(tmp_path / "t.json")])
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize(
    "extra", [["-"], ["-", "--command", "c"], ["time.log", "--command", "c"], ["time.log", "--wall-seconds", "5"]]
)
def test_time_flags_must_match_the_time_log(run_dir, tmp_path, extra, capsys):
    (tmp_path / "time.log").write_text(TIME_LOG)
    log, *flags = extra
    with pytest.raises(SystemExit):
        record([str(run_dir), log if log == "-" else str(tmp_path / log), str(tmp_path / "t.json"), *flags])
    assert "time_log" in capsys.readouterr().err and not (tmp_path / "t.json").exists()
