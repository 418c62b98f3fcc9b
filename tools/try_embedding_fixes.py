"""Two changes to a trained embedding model that need no training, scored on the retrieval tasks (issue 29's tries;
results in results/embeddings/tried/wise-ft-seed3 and logn-seed3, described in results/embeddings/trained/README.md).

- ``wise-ft A``: the weights A x trained + (1 - A) x the patched model before training (WiSE-FT, Wortsman et al.
  2022): does a mix keep the stock model's meaning at short lengths and the trained reading at long ones?
- ``logn P``: attention logits x (log n / log 512)^P for inputs of n > 512 tokens (shorter ones unchanged): does
  sharper attention over a long input keep each part's own meaning?

python tools/try_embedding_fixes.py RUN/model OUT wise-ft 1 0.5
python tools/try_embedding_fixes.py RUN/model OUT logn 1 2 --tasks passkey
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import posswap
from posswap.embeddings.retrieval import evaluate_retrieval, load_embedding_model
from posswap.training.recipe import load_recipe

RECIPE = "recipes/minilm-embed-2k.yaml"
LENGTHS = (256, 512, 1024, 2048)


def untrained_patched():
    recipe, _ = load_recipe(RECIPE)
    return posswap.patch(load_embedding_model(recipe.model), recipe.posswap)


def mixer(model):
    """A function of A that loads A x the trained weights + (1 - A) x the untrained patched ones into ``model``."""
    end = {k: v.detach().clone() for k, v in model.state_dict().items()}
    start = untrained_patched().state_dict()
    if end.keys() != start.keys():
        raise ValueError(f"Not the recipe's patch: the keys differ ({sorted(set(end) ^ set(start))[:3]}).")

    def mix(a: float) -> None:
        model.load_state_dict({k: (a * end[k].float() + (1 - a) * start[k].float()).to(end[k].dtype) for k in end})

    return mix


def log_n_scaler(model):
    """A function of P that scales every BERT self-attention's logits by (log n / log 512)^P for n > 512 tokens.
    It sets each module's ``scaling`` before that module's forward: one thread at a time (a trial, not a patch;
    posswap's own methods keep per-call values out of the modules)."""
    power = [0.0]
    attentions = [m for m in model.modules() if type(m).__name__ == "BertSelfAttention"]
    for module in attentions:
        base, forward = module.scaling, module.forward

        def scaled(hidden_states, *args, module=module, base=base, forward=forward, **kwargs):
            n = hidden_states.shape[1]
            module.scaling = base * max(1.0, math.log(n) / math.log(512)) ** power[0]
            return forward(hidden_states, *args, **kwargs)

        module.forward = scaled
    return lambda p: power.__setitem__(0, p)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("change", choices=("wise-ft", "logn"))
    parser.add_argument("values", type=float, nargs="+")
    parser.add_argument("--tasks", nargs="+", default=["passkey", "needle"])
    args = parser.parse_args()
    model = load_embedding_model(args.model)
    setting = (mixer if args.change == "wise-ft" else log_n_scaler)(model)
    for value in args.values:
        setting(value)
        name = f"{args.change} {value:g}"
        for task in args.tasks:
            results = evaluate_retrieval({name: model}, task=task, lengths=LENGTHS, seed=0)
            results.save(args.out / f"{task}-{value:g}")
            print(task, name, results.models[name].accuracy, flush=True)


if __name__ == "__main__":
    main()
