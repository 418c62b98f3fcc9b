"""`posswap study` stopped half-way and run again (issue 28): killed (SIGKILL) or interrupted (SIGINT, as Ctrl-C
sends it to every process of the study) in the middle of a run, it resumes on the same work folder, reuses what was
finished (the same files, untouched) and ends with the numbers of a study that ran straight through; a damaged file
of a finished run is set aside with one line and done again; a second study on a busy work folder is refused at
once, with one line, and the first finishes as if alone.

Both studies run tiny (the toy copier of test_copying, a 2-layer GPT-2 of 32 positions on a page of Emma) on one
thread, where they are deterministic: "the same numbers" means equal, not close. The study that is stopped runs in a
subprocess (``posswap study`` through ``posswap.cli.main``, its preset swapped for the tiny one) that waits at a gate
in the middle of one run's training, so the signal always arrives there; the resumed study, the second one on a busy
folder and the uninterrupted reference are ``main`` in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_copying import toy_spec

from posswap.cli import main
from posswap.study import copying, plan
from posswap.study.copying import CopyingSpec
from posswap.study.plan import BaseSpec, Budget, Probe

FAMILIES = ("copying", "text")
GATE = {"copying": "alibi", "text": "t5-bias"}  # the second run of each: the first is finished when it stops
DONE_FIRST = {"copying": "runs/copy/seed0.json", "text": "gpt2/quick/copy/model/model.safetensors"}
FINISHED = {"copying": "results/copying.json", "text": "results/gpt2/quick/summary.md"}  # written at the end
WAIT = 240  # seconds at most for a subprocess to reach its gate or to finish (2 shared cores)


def copying_spec() -> CopyingSpec:
    """Three runs (copy, alibi, the baseline), one seed, four steps on the toy copier (it cannot copy: no check)."""
    return toy_spec(variants=("copy", "alibi"), seeds=(0,), schedules={})


def text_spec(text: str) -> BaseSpec:
    """Three runs (copy, t5-bias, the baseline) of two steps, scored at 1x and 4x, probed, on a page of text."""
    return BaseSpec(
        name="gpt2",
        length=32,
        eval_tokens=256,
        variants=("copy", "t5-bias"),
        train_data=text,
        heldout=(text,),
        multiples=(1, 4),
        budget=Budget(steps=2, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=1),
        probe=Probe(span=8, multiples=(0.5, 2), spans=3),
    )


def install(config: dict) -> None:
    """In the study's subprocess: the tiny presets, and the gate (``config["gate"]``: the run to stop in, at its
    second step; it goes on once ``config["release"]`` exists, or after ``WAIT`` seconds)."""
    copying.COPYING_PRESETS["mini"] = copying_spec()
    plan.PRESETS["full"] = (text_spec(config["text"]),)
    gate, release = config.get("gate"), config.get("release")
    if gate is None:
        return

    def stop_here() -> None:
        print(f"GATE {gate}", flush=True)
        until = time.monotonic() + WAIT
        while time.monotonic() < until and not (release and Path(release).exists()):
            time.sleep(0.05)

    import posswap.training

    train_and_probe, train_step, train = copying.train_and_probe, copying.train_step, posswap.training.train
    now = {"run": None, "step": 0}

    def copying_run(base, spec, name, seed):
        now.update(run=name, step=0)
        return train_and_probe(base, spec, name, seed)

    def copying_step(model, optimizer, ids, **distill):
        now["step"] += 1
        if now["run"] == gate and now["step"] == 2:
            stop_here()
        return train_step(model, optimizer, ids, **distill)

    def text_run(recipe, raw=None, *args, callbacks=(), **kwargs):
        if Path(recipe.train.output_dir).name == gate:
            callbacks = [*callbacks, lambda step, loss, model: stop_here() if step == 1 else None]
        return train(recipe, raw, *args, callbacks=list(callbacks), **kwargs)

    copying.train_and_probe, copying.train_step, posswap.training.train = copying_run, copying_step, text_run


# The subprocess: this module's install(), then `posswap study`. Top level, not under __main__: the copying study's
# worker processes (spawned, they import this file as __mp_main__) get the gate too.
DRIVER = """
import json, os, signal, sys
sys.path.insert(0, os.environ["STUDY_TEST_DIR"])
import test_study_interrupts
test_study_interrupts.install(json.loads(os.environ["STUDY_TEST"]))
if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whatever the parent ignores
    from posswap.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def study_args(family: str, work: Path, bases: Path, jobs: int = 1) -> list[str]:
    folders = ["--work", str(work), "--out", str(work / "results")]  # never the default results/ of the checkout
    if family == "copying":
        return ["study", "--preset", "mini", *folders, "--jobs", str(jobs)]
    return ["study", "--preset", "full", "--model", "gpt2", "--reference", str(bases / "gpt2"), *folders]


class Running:
    """``posswap study`` in a subprocess of its own process group (Ctrl-C reaches the whole group)."""

    def __init__(self, setup, family: str, work: Path, gate: str | None = None, release: Path | None = None, jobs=1):
        config = {"text": str(setup["text"]), "gate": gate, "release": str(release) if release else None}
        env = {
            **os.environ,
            "STUDY_TEST": json.dumps(config),
            "STUDY_TEST_DIR": str(Path(__file__).parent),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",  # one thread: deterministic, and fast on 2 shared cores
        }
        self.work, self.out, self.err = work, work.parent / f"{work.name}.stdout", work.parent / f"{work.name}.stderr"
        work.parent.mkdir(parents=True, exist_ok=True)
        with self.out.open("w") as out, self.err.open("w") as err:  # files, not pipes: nothing blocks on a full pipe
            self.process = subprocess.Popen(
                [sys.executable, str(setup["driver"]), *study_args(family, work, setup["bases"], jobs)],
                stdout=out,
                stderr=err,
                env=env,
                cwd=work.parent,
                start_new_session=True,
            )

    def wait_for_gate(self, cached: str) -> None:
        """Until the gated run has stopped and ``cached`` (a finished run's file) is there (with --jobs 2 the first
        run may still be running when the second stops)."""
        until = time.monotonic() + WAIT
        while "GATE" not in self.out.read_text() or not (self.work / cached).exists():
            assert self.process.poll() is None, f"the study ended before its gate:\n{self.stderr()[-3000:]}"
            assert time.monotonic() < until, f"no gate after {WAIT} s:\n{self.stderr()[-3000:]}"
            time.sleep(0.1)

    def wait(self) -> int:
        return self.process.wait(timeout=WAIT)

    def stderr(self) -> str:
        return self.err.read_text()

    def stop(self) -> None:
        """Whatever is left of the group (a gated worker of a killed study), by the group's id."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def setup(bases, tmp_path_factory):
    """The driver script and a page of text; ``reference`` adds the uninterrupted studies."""
    root = tmp_path_factory.mktemp("interrupts")
    (root / "driver.py").write_text(DRIVER)
    (root / "page.txt").write_text((bases / "text.txt").read_text()[:20_000])
    return {"root": root, "driver": root / "driver.py", "text": root / "page.txt", "bases": bases, "numbers": {}}


def reference(setup, family: str) -> dict:
    """The numbers of a study of ``family`` that ran straight through, in a folder of its own (run here, once: the
    damaged-file tests reuse its folder afterwards)."""
    if family not in setup["numbers"]:
        work = setup["root"] / f"straight-{family}"
        with tiny_main(setup, setup["root"]) as run:
            assert run(family, work) == 0
        setup["numbers"][family] = results(family, work)
    return setup["numbers"][family]


@contextlib.contextmanager
def tiny_main(setup, cwd: Path):
    """``main`` here, with the tiny presets, on one thread as the subprocesses (the copying study sets it anyway)."""
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        patch.setitem(copying.COPYING_PRESETS, "mini", copying_spec())
        patch.setitem(plan.PRESETS, "full", (text_spec(str(setup["text"])),))
        torch.set_num_threads(1)
        try:
            yield lambda family, work: main(study_args(family, work, setup["bases"]))
        finally:
            torch.set_num_threads(threads)


def results(family: str, work: Path) -> dict:
    """Every number the study wrote, less its timings."""
    if family == "copying":
        found = json.loads((work / "results" / "copying.json").read_text())
        del found["timings_s"]
        for runs in found["runs"].values():
            for run in runs:
                del run["train_seconds"]
        return found
    out = work / "results" / "gpt2" / "quick"
    files = [
        *sorted(out.glob("*/*.json")),
        *(out / n for n in ("curves.json", "probe.json", "attention_by_distance.json")),
    ]
    found = {str(f.relative_to(out)): json.loads(f.read_text()) for f in files}
    assert all(seconds > 0 for seconds in found["curves.json"].pop("train_seconds").values())
    return found | {"summary.md": (out / "summary.md").read_text()}


def snapshot(work: Path, *leave_out: str) -> dict[str, tuple[int, bytes]]:
    """(mtime, bytes) of every file under ``work`` but lock files and the folders named ``leave_out``."""
    return {
        str(p.relative_to(work)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(work.rglob("*"))
        if p.is_file() and not p.name.endswith("posswap-lock") and not set(leave_out) & set(p.relative_to(work).parts)
    }


def running_in(group: int) -> list[int]:
    """The processes of process group ``group`` still running (one that exited but is not reaped yet is not)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(pgrp) == group and state != "Z":
            found.append(int(stat.parent.name))
    return found


def said(stderr: str) -> list[str]:
    """The lines of ``stderr`` but its progress bars (redrawn after a carriage return, nested ones moving the cursor
    up; a bar cut short by the interrupt has the next line right after it)."""
    text = re.sub(r"[^\r\n]*\[\d\d:\d\d[^\r\n]*?\]", "", stderr.replace("\x1b[A", ""))
    return [piece.strip() for piece in re.split(r"[\r\n]", text) if piece.strip()]


@pytest.fixture
def in_process(setup, tmp_path):
    with tiny_main(setup, tmp_path) as run:
        yield run


# The copying study with --jobs 2 (the default): worker processes. SIGKILL goes to the study's process alone (its
# workers must end with it), SIGINT to the whole group, as Ctrl-C in a terminal sends it.
# Each family under one signal, each signal once (the test run's time): SIGKILL leaves what a crash leaves, SIGINT
# runs the clean-up of a Ctrl-C.
CASES = [("copying", "SIGINT", 2), ("text", "SIGKILL", 1)]


@pytest.mark.parametrize("family, name, jobs", CASES, ids=[f"{f}-{n}" for f, n, _ in CASES])
def test_a_study_stopped_mid_run_resumes_to_the_uninterrupted_result(
    setup, in_process, tmp_path, capsys, family, name, jobs
):
    work = tmp_path / "work"
    study = Running(setup, family, work, gate=GATE[family], jobs=jobs)
    try:
        study.wait_for_gate(DONE_FIRST[family])
        assert not (work / FINISHED[family]).exists()  # stopped before the end
        if name == "SIGKILL":
            os.kill(study.process.pid, signal.SIGKILL)
        else:
            os.killpg(study.process.pid, signal.SIGINT)
        code = study.wait()
        until = time.monotonic() + 30
        while running_in(study.process.pid):  # its workers (and the pool's resource tracker) end with it
            assert time.monotonic() < until, f"processes outlived the study: {running_in(study.process.pid)}"
            time.sleep(0.1)
    finally:
        study.stop()
    err = study.stderr()
    if name == "SIGKILL":
        assert code == -signal.SIGKILL
    else:  # one line, no traceback (a worker of --jobs 2 printed one, idle or still importing)
        assert code == 130, err[-3000:]
        assert said(err) == ["posswap study: interrupted."], err[-3000:]
    # All that was finished: the gated run is redone, the results are written again.
    kept = snapshot(work, GATE[family], "results")
    assert DONE_FIRST[family] in kept and not (work / FINISHED[family]).exists()

    capsys.readouterr()
    assert in_process(family, work) == 0
    out, err = capsys.readouterr()
    if family == "copying":  # only the runs with no file ran again
        cached = [f for f in kept if f.startswith("runs/") and f.endswith("/seed0.json")]
        assert f"copying study: {3 - len(cached)} runs" in err
    else:
        assert f"posswap study: {work}/gpt2/quick/copy already trained with this recipe; reusing it." in out
        assert "quick/t5-bias already trained" not in out
    now = snapshot(work)
    assert {f: now.get(f) for f in kept} == kept  # the same files, neither rewritten nor touched
    assert results(family, work) == reference(setup, family)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_second_study_on_a_busy_work_folder_is_refused_at_once(setup, in_process, tmp_path, capsys, family):
    work, release = tmp_path / "work", tmp_path / "go"
    first = Running(setup, family, work, gate=GATE[family], release=release)
    try:
        first.wait_for_gate(DONE_FIRST[family])
        before = snapshot(work)
        capsys.readouterr()
        clock = time.perf_counter()
        assert in_process(family, work) == 2
        took = time.perf_counter() - clock
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, err
        assert re.fullmatch(
            rf"posswap study: error: another posswap study \(pid {first.process.pid}\) is using the work folder "
            rf"{re.escape(str(work))} now; wait for it to finish, or choose another --work\.\n",
            err,
        )
        assert took < 5, took  # refused before it scores, loads or trains anything
        assert snapshot(work) == before  # nothing written, nothing touched
        release.touch()
        assert first.wait() == 0, first.stderr()[-3000:]
    finally:
        first.stop()
    assert results(family, work) == reference(setup, family)  # the first ran as if alone


def cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    size = path.stat().st_size
    path.write_bytes((b"\xff\x00\x9c" * size)[:size])  # same length, not text (a header of 2^64 bytes)


def finished(setup, family: str) -> Path:
    """The reference's own work folder (its numbers read first): a finished study, every run in it, at the path its
    recipes name."""
    reference(setup, family)
    return setup["root"] / f"straight-{family}"


def damaged_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if " is damaged (" in line]


def test_damaged_copying_runs_are_set_aside_and_run_again(setup, in_process, capsys):
    work = finished(setup, "copying")
    runs = work / "runs"
    expected = {
        runs / "copy" / "seed0.json": (cut, "not readable: "),
        runs / "alibi" / "seed0.json": (garbage, "not text"),
        runs / "original trained" / "seed0.json": (
            lambda path: path.write_text("[1, 2]\n"),  # JSON, but not a run
            "not the expected record (AttributeError: 'list' object has no attribute 'get')",
        ),
    }
    damaged = {}
    for path, (damage, _) in expected.items():
        damage(path)
        damaged[path] = path.read_bytes()
    capsys.readouterr()
    assert in_process("copying", work) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = damaged_lines(out)
    assert len(lines) == len(expected), lines
    for path, (_, why) in expected.items():
        line = next(line for line in lines if line.startswith(f"posswap study: {path} is damaged ({why}"))
        assert line.endswith("); set aside as seed0.json.damaged, computing it again."), line
        assert (path.parent / "seed0.json.damaged").read_bytes() == damaged[path]  # kept, not deleted
    assert "copying study: 3 runs" in err  # each run again, from its start
    assert results("copying", work) == reference(setup, "copying")


def test_damaged_files_of_finished_text_runs_are_set_aside_and_done_again(setup, in_process, capsys):
    work = finished(setup, "text")
    runs, original = work / "gpt2" / "quick", str((setup["bases"] / "gpt2").resolve())
    score = next(  # a score of the original: read again by the rerun (a trained run's is new with its weights)
        p
        for p in sorted((work / "gpt2" / "scores").glob("*.json"))
        if json.loads(p.read_text())["key"]["model"].get("folder") == original
    )
    cut(runs / "copy" / "curve.json")
    garbage(runs / "t5-bias" / "model" / "model.safetensors")
    garbage(runs / "baseline" / "recipe.yaml")
    garbage(score)
    capsys.readouterr()
    assert in_process("text", work) == 0
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = damaged_lines(out)
    expected = {
        runs / "copy" / "curve.json": "not readable: ",
        runs / "t5-bias" / "model": "model.safetensors: Error while deserializing header: header too large",
        runs / "baseline" / "recipe.yaml": "not text",
        score: "not text",
    }
    assert len(lines) == len(expected), lines
    for path, why in expected.items():
        line = next(line for line in lines if line.startswith(f"posswap study: {path} is damaged ("))
        assert why in line and line.endswith(f"); set aside as {path.name}.damaged, computing it again."), line
        assert (path.parent / f"{path.name}.damaged").exists()
    assert "already trained" not in out  # every run had a damaged file: each trained again
    assert results("text", work) == reference(setup, "text")
