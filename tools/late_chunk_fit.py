"""How far a long model's late chunks are from the stock model's chunks read alone (issue 29): for held-out
documents of 2048 tokens cut from Persuasion (which no recipe trains on), the mean over documents of
``embedding.chunk_teacher``'s loss, 1 - cosine between each piece's mean token output in the whole document and
the stock model's embedding of that piece read alone. 0: late chunks are the stock chunks.

python tools/late_chunk_fit.py untrained RUN/model ... [--documents 16] [--out FILE.json]

``untrained``: the shipped recipe's patch on the stock model, before training.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

import posswap
from posswap.data import read_document
from posswap.embeddings.retrieval import load_embedding_model
from posswap.embeddings.training.chunks import LateChunkLoss, chunk_teacher_rows
from posswap.training.recipe import load_recipe

RECIPE = "recipes/minilm-embed-2k.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    recipe, _ = load_recipe(RECIPE)
    stock = load_embedding_model(recipe.model)
    with tempfile.TemporaryDirectory() as folder:
        held_out = Path(folder) / "persuasion.txt"
        held_out.write_text(read_document("persuasion"))
        rows = chunk_teacher_rows(stock, str(held_out), args.documents, args.length, args.seed, "text")
    labels = torch.tensor(rows["label"])
    fits = {}
    for name in args.models:
        model = (
            posswap.patch(load_embedding_model(recipe.model), recipe.posswap)
            if name == "untrained"
            else load_embedding_model(name)
        ).eval()
        loss = LateChunkLoss(model, stock.max_seq_length)
        with torch.no_grad():
            values = [float(loss([model.preprocess([t])], labels[i : i + 1])) for i, t in enumerate(rows["text"])]
        fits[name] = {"mean": sum(values) / len(values), "per_document": values}
        print(
            f"{name}: 1 - cosine, late chunk against the stock chunk, mean of {len(values)}: {fits[name]['mean']:.3f}"
        )
    if args.out:
        settings = {"documents": args.documents, "length": args.length, "seed": args.seed, "held_out": "persuasion"}
        args.out.write_text(json.dumps({"settings": settings, "models": fits}, indent=1) + "\n")


if __name__ == "__main__":
    main()
