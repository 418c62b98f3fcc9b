"""Training checkpoints that resume exactly and are never half-written.

A checkpoint is a folder ``checkpoint-<step>`` with ``model.safetensors`` (trainable weights), optimizer
tensors in ``optimizer.safetensors`` and its scalars in JSON, the scheduler state, the RNG states of each
process and ``state.json`` (step, data position). It is written as ``checkpoint-<step>.tmp`` and renamed
when complete, so a run killed at any moment leaves only complete checkpoints. No pickles anywhere.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

PREFIX = "checkpoint-"


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


def save_checkpoint(run_dir: Path, step: int, model_state: dict, optimizer, scheduler, progress: dict, rank: int, world: int, barrier) -> Path:
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
        (staging / "state.json").write_text(json.dumps({**progress, "step": step, "world_size": world}))
    barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
    barrier()
    return final


def completed_checkpoints(run_dir: Path) -> list[Path]:
    """``checkpoint-<step>`` folders, oldest first; ``.tmp`` folders (interrupted writes) are not among them."""
    done = [p for p in run_dir.glob(f"{PREFIX}*") if p.is_dir() and p.name[len(PREFIX):].isdigit()]
    return sorted(done, key=lambda p: int(p.name[len(PREFIX):]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    done = completed_checkpoints(run_dir)
    return done[-1] if done else None


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    for old in completed_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer, scheduler, rank: int, world: int) -> dict:
    state = json.loads((path / "state.json").read_text())
    if state["world_size"] != world:
        raise ValueError(
            f"{path} was written by {state['world_size']} processes but this run has {world}; "
            "resume with the same number of processes (the data order depends on it)."
        )
    weights = load_file(path / "model.safetensors")
    missing = set(weights) - set(dict(model.named_parameters()))
    if missing:
        raise ValueError(f"{path} holds weights this model does not have ({sorted(missing)[:3]}...): was the recipe changed?")
    with torch.no_grad():
        parameters = dict(model.named_parameters())
        for name, value in weights.items():
            parameters[name].copy_(value)
    optimizer.load_state_dict(_optimizer_from_files(load_file(path / "optimizer.safetensors"), json.loads((path / "optimizer.json").read_text())))
    scheduler.load_state_dict(json.loads((path / "scheduler.json").read_text()))
    rng = load_file(path / f"rng-{rank}.safetensors")
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    python_state = json.loads((path / f"rng-{rank}.json").read_text())["python"]
    random.setstate((python_state[0], tuple(python_state[1]), python_state[2]))
    return state
