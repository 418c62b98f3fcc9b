"""Keep one model's column of a ``retrieval.json`` written by ``posswap eval``, under the name the README's tables
show (``posswap eval`` names a column after the model's folder: a run's ``train.output_dir/model`` is ``model``):

    python tools/rename_retrieval_model.py EVAL_DIR/retrieval.json model minilm-embed-2k-exact OUT_DIR

Writes ``OUT_DIR/retrieval.json`` with that column alone (the stock model beside it is in ``baselines/``); every
number is the evaluation's own, nothing is recomputed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="retrieval.json written by posswap eval")
    parser.add_argument("model", help="the column to keep")
    parser.add_argument("name", help="its name in the tables")
    parser.add_argument("out", type=Path, help="folder for the new retrieval.json")
    args = parser.parse_args(argv)
    results = json.loads(args.source.read_text())
    if args.model not in results["models"]:
        raise SystemExit(f"{args.source} has no model {args.model!r}; it has {', '.join(results['models'])}.")
    results["models"] = {args.name: results["models"][args.model]}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "retrieval.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
