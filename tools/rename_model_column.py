"""Rename a model's column in an evaluation folder ``posswap eval`` wrote (``retrieval.json``: its ``models``;
``context.json``: its ``rows``; a retrieval plot is drawn again), in place: ``posswap eval`` names a column after the model's folder, and a run's
``train.output_dir/model`` is ``model``. Only the names change; every number is the evaluation's own.

    python tools/rename_model_column.py results/mpnet/trained-1k/context model mpnet-late-1k
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rename(folder: Path, old: str, new: str) -> Path:
    """Every column named ``old`` or starting ``old `` (its baselines: ``model late chunks``) gets ``new`` instead."""
    path = next((folder / name for name in ("retrieval.json", "context.json") if (folder / name).exists()), None)
    if path is None:
        raise SystemExit(f"{folder}: no retrieval.json or context.json (give a folder posswap eval wrote).")
    data = json.loads(path.read_text())
    key = "models" if "models" in data else "rows"
    names = list(data[key])
    if not any(name == old or name.startswith(old + " ") for name in names):
        raise SystemExit(f"{path}: no column {old!r} (columns: {', '.join(names)}).")
    data[key] = {(new + name[len(old) :] if name == old or name.startswith(old + " ") else name): value
                 for name, value in data[key].items()}  # fmt: skip
    path.write_text(json.dumps(data, indent=2) + "\n")
    if key == "models":  # its plot's legend names the columns too: drawn again from the renamed JSON
        from posswap.embeddings.retrieval import RetrievalResults, plot_retrieval

        plot_retrieval(RetrievalResults.load(folder), folder / "retrieval.png")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a folder posswap eval wrote")
    parser.add_argument("old", help="the column's name now (a run's model folder: model)")
    parser.add_argument("new", help="the name the tables should show")
    args = parser.parse_args(argv)
    print(f"renamed {args.old!r} to {args.new!r} in {rename(args.folder, args.old, args.new)}")


if __name__ == "__main__":
    main()
