"""Resume survives a damaged run folder: a truncated or corrupt checkpoint file is named and skipped for the
newest intact checkpoint (which resumes exactly), an empty checkpoint folder is ignored, a cut-short log line
is dropped, and a run with no intact checkpoint is refused with an error that names each damaged file.

One short run (tiny GPT-2, checkpoints at steps 2 and 4, killed at step 5) is built once for the module and
copied for every case. FSDP is not among the cases: resumable checkpoints under FSDP are refused up front
(train.save_every must reach max_steps there), so an FSDP run never has a checkpoint to damage.
"""

from __future__ import annotations

import json
import re
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_training import Interrupted, make_raw, run, stop_at

from posswap.training.checkpoint import CheckpointError

STEPS = 6  # checkpoints at 2 and 4 (not at the last step); the kill comes at 5


def truncate(name: str, checkpoint: int = 4):
    def damage(run_dir: Path) -> None:
        path = run_dir / f"checkpoint-{checkpoint}" / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return damage


def flip(name: str, checkpoint: int = 4):
    """Same length, still a loadable file: only the checksum can tell."""

    def damage(run_dir: Path) -> None:
        path = run_dir / f"checkpoint-{checkpoint}" / name
        data = bytearray(path.read_bytes())
        for i in range(len(data) - 64, len(data) - 48):  # inside the last tensor, past the header
            data[i] ^= 0xFF
        path.write_bytes(bytes(data))

    return damage


def delete(name: str, checkpoint: int = 4):
    return lambda run_dir: (run_dir / f"checkpoint-{checkpoint}" / name).unlink()


def empty_folder(name: str):
    return lambda run_dir: (run_dir / name).mkdir()


def cut_last_log_line(run_dir: Path) -> None:
    log = run_dir / "log.jsonl"
    log.write_text(log.read_text()[:-15])  # the last line loses its end and its newline


def both(*damages):
    return lambda run_dir: [damage(run_dir) for damage in damages]


REFUSES = "refuses"

# (damage to the killed run's folder, the warning or error that names what is wrong (None: no warning), what
# resume does: the checkpoint it resumes from, or REFUSES)
RESUME_CASES = {
    "truncated weights": (
        truncate("model.safetensors"),
        r"checkpoint-4/model\.safetensors does not match its sha256",
        2,
    ),
    "flipped bytes in weights": (
        flip("model.safetensors"),
        r"checkpoint-4/model\.safetensors does not match its sha256",
        2,
    ),
    "truncated optimizer tensors": (
        truncate("optimizer.safetensors"),
        r"checkpoint-4/optimizer\.safetensors does not match",
        2,
    ),
    "flipped bytes in optimizer tensors": (
        flip("optimizer.safetensors"),
        r"checkpoint-4/optimizer\.safetensors does not match",
        2,
    ),
    "truncated optimizer scalars": (truncate("optimizer.json"), r"checkpoint-4/optimizer\.json does not match", 2),
    "truncated scheduler": (truncate("scheduler.json"), r"checkpoint-4/scheduler\.json does not match", 2),
    "truncated RNG tensors": (truncate("rng-0.safetensors"), r"checkpoint-4/rng-0\.safetensors does not match", 2),
    "truncated RNG json": (truncate("rng-0.json"), r"checkpoint-4/rng-0\.json does not match", 2),
    "missing RNG file": (delete("rng-0.json"), r"checkpoint-4/rng-0\.json is missing", 2),
    "truncated state.json": (truncate("state.json"), r"checkpoint-4/state\.json is not valid JSON", 2),
    "missing state.json": (delete("state.json"), r"checkpoint-4/state\.json is missing", 2),
    "empty checkpoint folder": (empty_folder("checkpoint-6"), None, 4),
    "interrupted write (.tmp)": (empty_folder("checkpoint-6.tmp"), None, 4),
    "truncated last log line": (cut_last_log_line, r"log\.jsonl line 5 is cut short", 4),
    "every checkpoint damaged": (
        both(truncate("model.safetensors", 4), flip("scheduler.json", 2)),
        r"no intact checkpoint.*checkpoint-4/model\.safetensors.*checkpoint-2/scheduler\.json",
        REFUSES,
    ),
}


@pytest.fixture(scope="module")
def runs(bases, tmp_path_factory):
    """(raw recipe of a run killed at step 5, final weights of the same recipe run straight through)."""
    root = tmp_path_factory.mktemp("damaged")
    straight = run(make_raw(bases, root / "straight", max_steps=STEPS, save_every=2, keep_checkpoints=3))
    raw = make_raw(bases, root / "killed", max_steps=STEPS, save_every=2, keep_checkpoints=3)
    with pytest.raises(Interrupted):
        run(raw, callbacks=[stop_at(5)])
    return raw, load_file(straight / "model.safetensors")


def _posswap_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if re.search(r"Skipping checkpoint|log\.jsonl", str(w.message))]


@pytest.mark.parametrize("case", RESUME_CASES, ids=list(RESUME_CASES))
def test_resume_from_a_damaged_run(runs, tmp_path, capsys, case):
    damage, message, outcome = RESUME_CASES[case]
    killed, straight = runs
    run_dir = tmp_path / "run"
    shutil.copytree(killed["train"]["output_dir"], run_dir)
    damage(run_dir)
    raw = {**killed, "train": {**killed["train"], "output_dir": str(run_dir)}}
    if outcome == REFUSES:
        with pytest.raises(CheckpointError, match=message):
            run(raw, resume=True)
        assert not (run_dir / "model").exists()
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        final = run(raw, resume=True)
    said = _posswap_warnings(caught)
    assert any(re.search(message, text) for text in said) if message else said == []
    assert f"Resumed from {run_dir / f'checkpoint-{outcome}'} at step {outcome}." in capsys.readouterr().out
    assert [json.loads(line)["step"] for line in (run_dir / "log.jsonl").read_text().splitlines()] == list(
        range(1, STEPS + 1)
    )
    resumed = load_file(final / "model.safetensors")  # the fallback resumes exactly, as from the newest one
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], atol=1e-5, rtol=0)


def test_flipped_bytes_still_load_so_only_the_checksum_catches_them(runs, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(runs[0]["train"]["output_dir"], run_dir)
    before = {
        k: v.clone() for k, v in load_file(run_dir / "checkpoint-4" / "model.safetensors").items()
    }  # not the mmap
    flip("model.safetensors")(run_dir)
    after = load_file(run_dir / "checkpoint-4" / "model.safetensors")
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)
    state = json.loads((run_dir / "checkpoint-4" / "state.json").read_text())
    assert set(state["files"]) == {p.name for p in (run_dir / "checkpoint-4").iterdir()} - {"state.json"}
