"""Average the weights of runs of one embedding recipe (trained with other seeds) into one model folder, as
``embedding.soup`` does inside a run (sum in float64, divided, cast back):

    python tools/average_embedding_runs.py OUT RUN0/model RUN1/model RUN2/model RUN3/model

For runs trained one by one (``posswap train RECIPE --set train.seed=N``): the folder equals what the recipe with
``embedding.soup: 4`` and ``train.seed`` the first seed saves (tests/test_embedding_training.py checks that a soup
is the mean of its seeds' runs). Refuses folders whose weights do not match name for name.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from posswap.embeddings.retrieval import load_embedding_model
from posswap.embeddings.training.trainer import mean_weights
from posswap.sentence_models import save


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="new folder for the averaged model")
    parser.add_argument("runs", nargs="+", help="model folders of the runs")
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new folder.")
    model = load_embedding_model(args.runs[0])
    others = (load_embedding_model(run).state_dict() for run in args.runs[1:])
    try:
        model.load_state_dict(mean_weights(itertools.chain([model.state_dict()], others)))
    except ValueError as error:
        raise SystemExit(str(error)) from None
    save(model.eval(), args.out)
    print(f"Wrote {args.out}: the mean of {len(args.runs)} runs.")


if __name__ == "__main__":
    main()
