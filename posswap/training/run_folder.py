"""The run folder a recipe trains into: what is refused before any model loads (the model folder it would
replace, old checkpoints, a Hub login), the recipe it was started with, and the push at the end. Shared by the
MLM/CLM loop and the embedding recipe."""

from __future__ import annotations

import json
from pathlib import Path

from ..files import check_folder_target, check_writable
from ..loading import resolve_model_id
from .checkpoint import check_optimizer_groups, latest_checkpoint, resumable_checkpoint
from .optimizer import group_settings
from .recipe import Recipe, recipe_differences

RECIPE_JSON = "recipe.json"  # the resolved recipe the run's checkpoints were made with


def local_source(name: str) -> str | None:
    """The folder the model is read from, if it is one (a run must not replace its own starting point)."""
    path = resolve_model_id(name)
    return path if Path(path).exists() else None


def check_before_work(recipe: Recipe, resume: bool, overwrite: bool, force: bool):
    """Everything that can be refused before a model is loaded; returns the checkpoint to resume from (or None)."""
    t, run_dir = recipe.train, Path(recipe.train.output_dir)
    final_dir = run_dir / "model"
    # Found out now, not after the training: the final save may not replace what is there.
    check_folder_target(
        final_dir, overwrite or resume, local_source(recipe.model), flag="train.output_dir: model folder"
    )
    check_writable(final_dir, flag="train.output_dir: model folder")  # permissions, a read-only or immutable folder
    if not resume and latest_checkpoint(run_dir) is not None:
        raise ValueError(
            f"{run_dir} already holds checkpoints: pass --resume to continue, or choose another train.output_dir."
        )
    checkpoint = resumable_checkpoint(run_dir) if resume else None  # checked before anything is loaded
    if checkpoint is not None:  # also under --force: a changed group count cannot carry the optimizer over
        check_optimizer_groups(checkpoint, len(group_settings(t)))
    if resume and not force:
        check_same_recipe(run_dir, recipe)
    if recipe.push_to_hub:
        from huggingface_hub import get_token

        if get_token() is None:  # found out now, not after the training
            raise ValueError(
                "push_to_hub is set but you are not logged in to the Hub: run `hf auth login` or set HF_TOKEN."
            )
    return checkpoint


def check_same_recipe(run_dir: Path, recipe: Recipe) -> None:
    """Refuse to resume checkpoints made with another recipe, naming the keys that differ."""
    stored = run_dir / RECIPE_JSON
    if not stored.is_file():  # a run folder from before recipe.json was kept: nothing to compare with
        return
    changed = recipe_differences(json.loads(stored.read_text()), json.loads(json.dumps(recipe.to_dict())))
    if changed:
        raise ValueError(
            f"--resume: the checkpoints in {run_dir} were made with another recipe; it differs in "
            f"{'; '.join(changed)}. Pass --force to resume with this one anyway, or choose another train.output_dir."
        )


def push_run(recipe: Recipe, final_dir: Path, run_dir: Path, describe: bool = True) -> None:
    """``final_dir`` to the recipe's repo; ``describe``: with posswap's card of the run (False: the folder's own
    README.md, as a sentence-transformers folder has one from its trainer)."""
    from huggingface_hub.errors import HfHubHTTPError

    from ..hub import push_to_hub

    results = run_dir / "eval" / "results.json"
    card_args = {
        "results": results if results.exists() else None,
        "plots": sorted((run_dir / "eval").glob("*.png")),
        "base_model": None if Path(recipe.model).exists() or recipe.model.startswith("posswap:") else recipe.model,
        "data": recipe.data.train,
        "steps": recipe.train.max_steps,
    }
    try:
        url = push_to_hub(final_dir, recipe.push_to_hub, **(card_args if describe else {}))
    except (OSError, HfHubHTTPError) as error:  # the run is not lost: say where it is and how to push it
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0].rstrip(".")  # the Hub's first line
        raise OSError(
            f"the trained model is saved in {final_dir}, but the push to {recipe.push_to_hub} failed: {reason}. "
            f"Push it with `posswap push {final_dir} {recipe.push_to_hub}`."
        ) from None
    print(f"Pushed to {url}")
