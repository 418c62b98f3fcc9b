"""A study run's files: whether a run finished (and reads back), what damaged one, its timing and its record, and
the machine it ran on. The runner (``runner.py``) asks before it trains anything, so an interrupted study resumes
where it stopped."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch
import yaml

from ..config import load_yaml
from ..portable.posswap_block import migrate_block
from .scoring import damage, set_aside, write_json

TRAIN_SECONDS = "train_seconds.json"  # a study run's training time, written when it finishes


def run_seconds(run_dir: Path) -> float | None:
    """Seconds ``run_dir``'s training took (None for a run from before the study recorded it)."""
    path = run_dir / TRAIN_SECONDS
    return json.loads(path.read_text())["seconds"] if path.is_file() else None


def finished_run(run_dir: Path, raw: dict, curve_file: Path | None) -> bool:
    """``run_dir`` holds a finished run of ``raw`` that reads back. A damaged file of it (its recipe, its curve, its
    model's config or weights: cut short or overwritten on disk) is set aside with one line, and the run is trained
    again, instead of the study stopping on it."""
    model, recipe = run_dir / "model", run_dir / "recipe.yaml"
    if not (model / "config.json").exists() or not recipe.exists():
        return False
    try:
        saved = load_yaml(recipe.read_text())
    except (ValueError, yaml.YAMLError) as error:
        set_aside(recipe, damage(error))
        return False
    if not same_recipe(saved, raw):
        return False
    if curve_file is not None and curve_file.exists():
        try:
            json.loads(curve_file.read_text())
        except ValueError as error:
            set_aside(curve_file, damage(error))
            return False
    broken = damaged_model(model)
    if broken is not None:
        set_aside(model, broken)
        return False
    return True


def damaged_model(folder: Path) -> str | None:
    """Why a saved model folder would not load (its config is not JSON, a weights file is cut short or its header
    overwritten), or None. Reads only the headers: a byte changed inside a tensor is not found here."""
    from safetensors import SafetensorError, safe_open

    try:
        json.loads((folder / "config.json").read_text())
    except ValueError as error:
        return f"config.json {damage(error)}"
    for weights in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(weights), "pt"):
                pass
        except (SafetensorError, OSError) as error:
            return f"{weights.name}: {' '.join(str(error).split())}"
    return None


def same_recipe(saved, raw: dict) -> bool:
    """A finished run's recipe is this one; a run saved by an older posswap still is (its posswap block is read
    with today's key names, as a saved model's is)."""
    if isinstance(saved, dict) and isinstance(saved.get("posswap"), dict):
        saved = {**saved, "posswap": migrate_block(saved["posswap"])}
    return saved == raw


def record_run(path: Path, record: dict) -> Path:
    """Write this run's record, keeping the earlier runs' records under ``earlier_runs``: a rerun that reuses the
    trained models takes minutes, and must not replace the timing of the run that trained them."""
    earlier = []
    if path.is_file():
        previous = json.loads(path.read_text())
        earlier = previous.pop("earlier_runs", []) + [{k: v for k, v in previous.items() if k != "spec"}]
    return write_json(path, {**record, "earlier_runs": earlier})


def hardware(device: str | None = None) -> dict:
    import transformers

    from ..evaluation.stream import resolve_device

    description = f"{torch.get_num_threads()} CPU threads ({platform.processor() or platform.machine()})"
    if resolve_device(device).type == "cuda":
        description = torch.cuda.get_device_name(0)
    return {
        "description": description,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
