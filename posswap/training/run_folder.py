"""The run folder a recipe trains into: what is refused before any model loads (the model folder it would
replace, old checkpoints, a Hub login), the recipe it was started with, and the push at the end. Shared by the
MLM/CLM loop and the embedding recipe.

A run folder's files describe the model in it. While it holds a model of an earlier run, a new run (``--overwrite``,
or ``--resume`` of a finished run) writes its recipe, log and checkpoints into ``RUN/.posswap-pending`` beside it,
and its model there too; only then does that folder replace the earlier run's files (:func:`commit`): one rename
(to ``RUN/.posswap-committed``) is the switch, and its entries then take the place of the earlier ones. A kill at
any moment before that rename leaves the earlier run as it was; one after it is finished by the next run on the
folder. Files posswap did not write in RUN are left where they are."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import sys
from pathlib import Path

import yaml

from ..files import check_folder_target, check_writable
from ..loading import resolve_model_id
from ..portable.posswap_files import clean_stale, swap_into_place
from .checkpoint import check_optimizer_groups, latest_checkpoint, prune_checkpoints, resumable_checkpoint
from .optimizer import group_settings
from .recipe import Recipe, recipe_differences

RECIPE_JSON = "recipe.json"  # the resolved recipe the run's checkpoints were made with
RECIPE_YAML = "recipe.yaml"  # the recipe as given (with --set applied)
LOG = "log.jsonl"
PENDING = ".posswap-pending"  # the next run, while the folder holds an earlier run's model
COMMITTED = ".posswap-committed"  # a pending run whose model is complete, being moved into place


def local_source(name: str) -> str | None:
    """The folder the model is read from, if it is one (a run must not replace its own starting point)."""
    path = resolve_model_id(name)
    return path if Path(path).exists() else None


def check_before_work(recipe: Recipe, resume: bool, overwrite: bool, force: bool) -> tuple[Path | None, Path]:
    """Everything that can be refused before a model is loaded; returns the checkpoint to resume from (or None) and
    the folder the run writes in (:func:`work_folder`)."""
    t, run_dir = recipe.train, Path(recipe.train.output_dir)
    final_dir, work = run_dir / "model", work_folder(run_dir)
    # Found out now, not after the training: the final save may not replace what is there.
    check_folder_target(
        final_dir, overwrite or resume, local_source(recipe.model), flag="train.output_dir: model folder"
    )
    check_writable(final_dir, flag="train.output_dir: model folder")  # permissions, a read-only or immutable folder
    if not resume and latest_checkpoint(run_dir) is not None:
        raise ValueError(
            f"{run_dir} already holds checkpoints: pass --resume to continue, or choose another train.output_dir."
        )
    if not resume and work != run_dir and latest_checkpoint(work) is not None:
        raise ValueError(
            f"{work} holds the checkpoints of an unfinished run that was to replace {final_dir}: pass --resume to "
            f"continue it, or remove {work} to start again."
        )
    # On a resume: the pending run's checkpoints, or those of the finished run in the folder itself.
    checkpoint = resumable_checkpoint(work if latest_checkpoint(work) else run_dir) if resume else None
    if checkpoint is not None:  # also under --force: a changed group count cannot carry the optimizer over
        check_optimizer_groups(checkpoint, len(group_settings(t)))
    if resume and not force:
        check_same_recipe(record_folder(run_dir, work), recipe)
    if recipe.push_to_hub:
        from huggingface_hub import get_token

        if get_token() is None:  # found out now, not after the training
            raise ValueError(
                "push_to_hub is set but you are not logged in to the Hub: run `hf auth login` or set HF_TOKEN."
            )
    return checkpoint, work


def work_folder(run_dir: Path) -> Path:
    """Where a run in ``run_dir`` writes its recipe, log, checkpoints and model: ``run_dir`` itself, or its pending
    folder while it holds a model (or a pending or committed run) that the new model is to replace."""
    pending = run_dir / PENDING
    held = any((run_dir / name).exists() for name in ("model", PENDING, COMMITTED))
    return pending if held else run_dir


def record_folder(run_dir: Path, work: Path) -> Path:
    """The folder whose recipe and log a resumed run continues: the pending run's once it has written them."""
    return work if (work / RECIPE_JSON).is_file() else run_dir


def start_record(work: Path, recipe: Recipe, raw, fresh: bool) -> None:
    """The start of a run, once its inputs are known to be good: a line that says which recipe file it runs
    (:func:`announce`), and the recipe as given (``recipe.yaml``) and as resolved with that file (``recipe.json``)
    in ``work``; a pending folder that a killed run left is started afresh (``fresh``: not a resume)."""
    announce(recipe)
    if fresh and work.name == PENDING and work.is_dir():
        shutil.rmtree(work)  # posswap's: the record and model of a run that never replaced the folder's
    work.mkdir(parents=True, exist_ok=True)
    (work / RECIPE_YAML).write_text(yaml.safe_dump(raw or {}, sort_keys=False))
    source = recipe.source.path if recipe.source is not None else None
    resolved = {**recipe.to_dict(), "recipe_file": str(source) if source is not None else None}
    (work / RECIPE_JSON).write_text(json.dumps(resolved, indent=1) + "\n")


def announce(recipe: Recipe) -> None:
    """One line on stderr at the start of a run: the file the recipe was read from (and a local file of that name
    that the shipped recipe took the place of). The main process only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"posswap train: {recipe.source.describe() if recipe.source else 'a recipe built in Python'}",
            file=sys.stderr,
        )


def commit(run_dir: Path, work: Path, keep_checkpoints: int | None = None) -> None:
    """Put the pending run, its model complete, in place of the earlier one (nothing to do when the run wrote in
    ``run_dir`` itself); ``keep_checkpoints``: prune the checkpoints the folder then holds."""
    if work == run_dir:
        return
    os.replace(work, run_dir / COMMITTED)  # the switch: from here on the folder is the new run's
    finish_commit(run_dir)
    if keep_checkpoints is not None:
        prune_checkpoints(run_dir, keep_checkpoints)


def finish_commit(run_dir: Path) -> None:
    """Move a committed run's entries into ``run_dir`` (the model first), replacing the earlier run's; the earlier
    run's evaluation goes (it scored the earlier model). Safe to call again after a kill part-way."""
    done = run_dir / COMMITTED
    if not done.is_dir():
        return
    _drop_earlier_evaluation(run_dir / "eval")
    for entry in sorted(done.iterdir(), key=lambda path: path.name != "model"):
        target = run_dir / entry.name
        if entry.is_dir() and not entry.is_symlink():
            clean_stale(target)  # a folder a kill left moved aside comes back, to be replaced
            swap_into_place(entry, target)
        else:
            os.replace(entry, target)
    done.rmdir()


# What posswap's evaluation writes in a run's eval/ (evaluation/harness.py, plots.py).
EVALUATION_FILES = ("results.json", "ppl_vs_length.png", "mlm_loss_vs_length.png", "per_position_loss.png")
EVALUATION_PLOTS = ("passkey_*.png", "similarity_*.png")


def _drop_earlier_evaluation(folder: Path) -> None:
    """The files posswap's evaluation wrote (results.json, its plots); anything else there stays."""
    if not folder.is_dir() or folder.is_symlink():
        return
    for path in folder.iterdir():
        ours = path.name in EVALUATION_FILES or any(fnmatch.fnmatch(path.name, p) for p in EVALUATION_PLOTS)
        if ours and path.is_file() and not path.is_symlink():
            path.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()


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
