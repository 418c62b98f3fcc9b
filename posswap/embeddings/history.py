"""``results/context/history/``: the late recipe's earlier runs and the changes tried on it, at most :data:`CAP`.

A run leaves the top of ``results/context/`` for the history when the recipe changes (``add``); the history keeps
its last :data:`CAP` entries, in the order they came (``index.json``), and each older one leaves a row in
``results/context/history-summary.json`` (the figures the placement table of docs/late-chunking.md shows, its
training and the files its change touched) before its folder is removed::

    python -m posswap.embeddings.history add results/context/minilm-late-2k-seed0 --name minilm-late-2k-old-seed0
    python -m posswap.embeddings.history prune    # the cap again, after runs were moved in by hand
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the clone: results/ lives there
RESULTS = ROOT / "results" / "context"
CAP = 10  # runs kept whole in history/; the older ones are rows of the summary
SUMMARY = "history-summary.json"  # beside history/, in results/context/
INDEX = "index.json"  # in history/: its entries, oldest first


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def runs(root: Path) -> list[Path]:
    """The run folders of ``root`` (each with ``context/context.json``), by name."""
    return sorted(p for p in root.iterdir() if (p / "context" / "context.json").is_file())


def recipe_late_row(context: dict) -> str:
    """The context.json row of the recipe's late chunks: the last model's (the stock model and the untrained patch
    come first)."""
    return [r for r in context["rows"] if r.endswith(" late chunks")][-1]


def retrieval_columns(models: dict) -> tuple[str, str, str]:
    """A retrieval.json's stock chunk-max column, the recipe's late-chunk-max column and its one-vector column."""
    stock = next(name for name in models if " chunk-max@" in name and " late-" not in name)
    late = [name for name in models if " late-chunk-max@" in name][-1]
    return stock, late, late.split(" late-chunk-max@")[0]


def placement_row(run: Path) -> dict:
    """A run's figures in the placement table: its late chunks on the context task per length, needle late - stock
    chunks and passkey one vector per length (None where it was not scored)."""
    context = load(run / "context" / "context.json")
    row = {
        "run": run.name,
        "lengths": context["lengths"],
        "context": context["rows"][recipe_late_row(context)]["accuracy"],
    }
    for task, key in (("needle", "needle_late_minus_stock"), ("passkey", "passkey_one_vector")):
        path = run / task / "retrieval.json"
        if not path.is_file():
            row[key] = None
            continue
        models = load(path)["models"]
        stock, late, vector = retrieval_columns(models)
        pairs = zip(models[late]["accuracy"], models[stock]["accuracy"])
        row[key] = [round(a - b, 4) for a, b in pairs] if task == "needle" else models[vector]["accuracy"]
    return row


def changed_files(diff: str) -> list[str]:
    """The files a diff changes, by its ``+++`` lines (``git diff --no-index NEW OLD`` writes ``+++ a/``: the
    earlier recipe's runs were recorded that way)."""
    return sorted(set(re.findall(r"^\+\+\+ [ab]/(\S+)", diff, re.M)))


def summary_row(entry: Path) -> list[dict]:
    """What a pruned entry leaves: a row per run in it (a ``task-seed-N`` folder holds runs), with its training
    (command, steps, wall and CPU time) and the files its ``changes.diff`` touched."""
    rows = []
    for run in runs(entry) if not (entry / "context").is_dir() else [entry]:
        row = {"entry": entry.name, **placement_row(run)}
        diff = run / "changes.diff"
        row["changes"] = changed_files(diff.read_text()) if diff.is_file() else []
        training = run / "training.json"
        if training.is_file():
            done = load(training)
            row["training"] = {k: done.get(k) for k in ("command", "steps", "wall_seconds", "cpu_seconds")}
        rows.append(row)
    return rows


def order(history: Path) -> list[str]:
    """The history's entries, oldest first: ``index.json``'s order, then any entry it does not list, by name."""
    listed = load(history / INDEX)["order"] if (history / INDEX).is_file() else []
    present = sorted(p.name for p in history.iterdir() if p.is_dir())
    return [n for n in listed if n in present] + [n for n in present if n not in listed]


def dropped(names: list[str], cap: int) -> list[str]:
    """The entries past the cap, oldest first."""
    return names[: max(0, len(names) - cap)]


def check_unneeded(history: Path, names: list[str]) -> None:
    """Refuse (one line) to drop a run whose figures a graph run compares with (``results/*/*/source.json``'s
    ``torch_results``, relative to the clone; tools/evaluate_late_model.py --compare): its page would lose them.
    ``results/`` is the one that holds ``history`` (results/context/history)."""
    results = history.parents[1]
    folders = [(history / n).resolve() for n in names]
    for source in sorted(results.glob("*/*/source.json")):
        named = load(source).get("torch_results")
        for folder in folders:
            if named and (results.parent / named).resolve() == folder:
                raise ValueError(
                    f"{folder} holds the torch figures {source} compares its graph with: copy them beside it and "
                    "point its torch_results there before the history drops the run."
                )


def prune(history: Path = RESULTS / "history", cap: int = CAP) -> list[str]:
    """Keep the last ``cap`` entries of ``history``; each older one becomes rows of the summary, then is removed
    (none while a graph run still compares with it: :func:`check_unneeded`). Returns the names removed."""
    names = order(history)
    old = dropped(names, cap)
    kept = names[len(old) :]
    check_unneeded(history, old)
    summary = history.parent / SUMMARY
    table = load(summary) if summary.is_file() else {"about": __doc__.splitlines()[0], "rows": []}
    for name in old:
        table["rows"] += summary_row(history / name)
    if old:  # the rows first: a run is removed only once its row is written
        summary.write_text(json.dumps(table, indent=1) + "\n")
        for name in old:
            shutil.rmtree(history / name)
    (history / INDEX).write_text(json.dumps({"cap": cap, "order": kept}, indent=1) + "\n")
    return old


def add(run: Path, history: Path = RESULTS / "history", name: str | None = None, cap: int = CAP) -> Path:
    """Move ``run`` into ``history`` (as ``name``), newest, and keep the cap. Returns its new folder."""
    target = history / (name or run.name)
    if target.exists():
        raise FileExistsError(f"{target} exists: give the run another --name.")
    history.mkdir(parents=True, exist_ok=True)
    names = order(history)
    check_unneeded(history, dropped([*names, target.name], cap))  # before anything moves
    shutil.move(str(run), str(target))
    (history / INDEX).write_text(json.dumps({"cap": cap, "order": [*names, target.name]}, indent=1) + "\n")
    prune(history, cap)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posswap.embeddings.history", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add", help="move a run into the history, then keep the cap")
    adding.add_argument("run", type=Path)
    adding.add_argument("--name", help="its name in the history (default: its folder's)")
    commands.add_parser("prune", help="keep the last ten entries; older ones become rows of the summary")
    args = parser.parse_args(argv)
    try:
        if args.command == "add":
            print(add(args.run, name=args.name))
        else:
            print("\n".join(f"pruned {name}" for name in prune()) or "nothing to prune")
    except (ValueError, FileExistsError) as error:  # one line, nothing moved
        print(f"history: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
