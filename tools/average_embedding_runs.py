"""Average the weights of runs of one embedding recipe (trained with other seeds) into one model folder, as
``embedding.soup`` does inside a run (sum in float64, divided, cast back):

    python tools/average_embedding_runs.py OUT RUN0/model RUN1/model RUN2/model RUN3/model

For runs trained one by one (``posswap train RECIPE --set train.seed=N``): the folder equals what the recipe with
``embedding.soup: 4`` and ``train.seed`` the first seed saves (tests/test_embedding_training.py checks that a soup
is the mean of its seeds' runs). Refuses folders whose weights do not match name for name.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posswap.evaluation.retrieval import load_embedding_model
from posswap.sentence_models import save


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="new folder for the averaged model")
    parser.add_argument("runs", nargs="+", help="model folders of the runs")
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give a new folder.")
    models = [load_embedding_model(run) for run in args.runs]
    states = [model.state_dict() for model in models]
    if any(state.keys() != states[0].keys() for state in states):
        raise SystemExit("The runs' weights differ in their names: not runs of one recipe.")
    total = {name: sum(state[name].double() for state in states) for name in states[0]}
    models[0].load_state_dict({name: (value / len(states)).to(states[0][name].dtype) for name, value in total.items()})
    save(models[0].eval(), args.out)
    print(f"Wrote {args.out}: the mean of {len(states)} runs.")


if __name__ == "__main__":
    main()
