"""Training checkpoints that resume exactly and are never half-written.

A checkpoint is a folder ``checkpoint-<step>`` with ``model.safetensors`` (trainable weights), optimizer
tensors in ``optimizer.safetensors`` and its scalars in JSON, the scheduler state, the RNG states of each
process and ``state.json`` (step, data position, the sha256 of every other file). It is written as
``checkpoint-<step>.tmp`` and renamed when complete, so a run killed at any moment leaves only complete
checkpoints; the checksums catch what happens to the files afterwards (a full disk, a bad copy, flipped bits):
resume skips a damaged checkpoint, with a warning that names the file, for the newest intact one. No pickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

PREFIX = "checkpoint-"


class CheckpointError(ValueError):
    """A checkpoint file that is missing, cut short or not what was written; the message names the file."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path} is not valid JSON, truncated or corrupt ({error})") from None


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (OSError, SafetensorError) as error:
        raise CheckpointError(f"{path} cannot be read, truncated or corrupt ({error})") from None


def _optimizer_to_files(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for index, per_param in state["state"].items():
        for key, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{key}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{key}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _optimizer_from_files(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict[str, Any]] = {}
    for flat, value in list(tensors.items()) + list(meta["scalars"].items()):
        index, key = flat.split(".", 1)
        state.setdefault(int(index), {})[key] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(
    run_dir: Path, step: int, model_state: dict, optimizer, scheduler, progress: dict, rank: int, world: int, barrier
) -> Path:
    """Every process writes its RNG state; the main process (rank 0) writes the rest and renames."""
    final = run_dir / f"{PREFIX}{step}"
    staging = run_dir / f"{PREFIX}{step}.tmp"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier()
    rng = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    save_file(rng, staging / f"rng-{rank}.safetensors")
    with open(staging / f"rng-{rank}.json", "w") as f:
        json.dump({"python": random.getstate()}, f)
    if rank == 0:
        save_file({k: v.detach().cpu().contiguous() for k, v in model_state.items()}, staging / "model.safetensors")
        tensors, meta = _optimizer_to_files(optimizer.state_dict())
        save_file(tensors, staging / "optimizer.safetensors")
        (staging / "optimizer.json").write_text(json.dumps(meta))
        (staging / "scheduler.json").write_text(json.dumps(scheduler.state_dict()))
    barrier()
    if rank == 0:
        # state.json last, once every process's files are there: it vouches for each of them by checksum.
        files = {p.name: _sha256(p) for p in sorted(staging.iterdir())}
        (staging / "state.json").write_text(json.dumps({**progress, "step": step, "world_size": world, "files": files}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    barrier()
    return final


def completed_checkpoints(run_dir: Path) -> list[Path]:
    """``checkpoint-<step>`` folders, oldest first; ``.tmp`` folders (interrupted writes) and empty ones are not
    among them."""
    done = [
        p for p in run_dir.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX) :].isdigit() and any(p.iterdir())
    ]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX) :]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = completed_checkpoints(run_dir)
    return done[-1] if done else None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in completed_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def verify_checkpoint(path: Path) -> dict:
    """``state.json`` of ``path`` once every file it lists is there with its checksum; else CheckpointError."""
    state = _read_json(path / "state.json")
    for name, expected in state.get("files", {}).items():  # none in checkpoints of posswap before checksums
        if not (path / name).is_file():
            raise CheckpointError(f"{path / name} is missing")
        if _sha256(path / name) != expected:
            raise CheckpointError(f"{path / name} does not match its sha256 in state.json: truncated or corrupt")
    return state


def resumable_checkpoint(run_dir: Path) -> Path:
    """The newest intact checkpoint. Each newer damaged one is skipped with a warning that says why (it is
    overwritten when the run gets there again); none intact is an error that names each damaged file."""
    damaged = []
    for path in reversed(completed_checkpoints(run_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as error:
            warnings.warn(f"Skipping {path.name} for resume: {error}.", stacklevel=2)
            damaged.append(str(error))
    if not damaged:
        raise ValueError(f"--resume: no checkpoint in {run_dir} to resume from.")
    raise CheckpointError(f"--resume: no intact checkpoint in {run_dir}: " + "; ".join(damaged))


def check_optimizer_groups(path: Path, groups: int) -> None:
    """Refuse, before the model is built, a checkpoint whose AdamW group count differs from the recipe's
    (``train.position_lr`` adds two groups): its optimizer state cannot carry over."""
    made = len(_read_json(path / "optimizer.json")["param_groups"])
    if made != groups:
        raise ValueError(
            f"{path} was made with {made} optimizer groups, this recipe builds {groups}: train.position_lr was set or "
            "unset since. Resume with the run's own train.position_lr, or start a new run."
        )


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer, scheduler, rank: int, world: int) -> dict:
    state = _read_json(path / "state.json")
    if state["world_size"] != world:
        raise ValueError(
            f"{path} was written by {state['world_size']} processes but this run has {world}; "
            "resume with the same number of processes (the data order depends on it)."
        )
    weights = _read_tensors(path / "model.safetensors")
    missing = set(weights) - set(dict(model.named_parameters()))
    if missing:
        raise ValueError(
            f"{path} holds weights this model does not have ({sorted(missing)[:3]}...): was the recipe changed?"
        )
    with torch.no_grad():
        parameters = dict(model.named_parameters())
        for name, value in weights.items():
            parameters[name].copy_(value)
    optimizer.load_state_dict(
        _optimizer_from_files(_read_tensors(path / "optimizer.safetensors"), _read_json(path / "optimizer.json"))
    )
    scheduler.load_state_dict(_read_json(path / "scheduler.json"))
    rng = _read_tensors(path / f"rng-{rank}.safetensors")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    python_state = _read_json(path / f"rng-{rank}.json")["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    return state


def log_lines_upto(log: Path, step: int) -> list[str]:
    """Lines of ``log.jsonl`` up to ``step``: what the resumed weights went through. A line that a kill cut
    short has no step to keep it by: it is dropped with a warning."""
    kept = []
    for number, line in enumerate(log.read_text(errors="replace").splitlines() if log.exists() else [], 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            warnings.warn(f"{log} line {number} is cut short or corrupt ({line[:40]!r}...): dropped.", stacklevel=2)
            continue
        if entry["step"] <= step:
            kept.append(line)
    return kept
