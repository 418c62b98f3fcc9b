"""``posswap demo``: the README's first command, on the real all-MiniLM-L6-v2 (a sentence-transformers model with
512 learned positions, which it reads 256 at a time). Patch it to read 2048 tokens with the shipped embedding
recipe's placement, train it briefly with that recipe, and score passkey (or needle) retrieval against what a user
with a vector database does today: truncate, or cut each document into chunks the stock model reads."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .evaluation.retrieval import (
    DEFAULT_LENGTHS,
    RetrievalResults,
    check_retrieval_inputs,
    evaluate_retrieval,
    load_embedding_model,
)
from .files import check_output_dir
from .loading import quiet_transformers
from .patching import patch
from .shipped_recipes import shipped_recipes
from .training.loop import train
from .training.recipe import load_recipe

DEMO_RECIPE = "minilm-embed-2k"  # the shipped recipe the demo shortens: posswap train minilm-embed-2k is the full run
BASELINES = ["chunk-mean", "chunk-max", "late-chunk-max"]


def demo_recipe(steps: int, output_dir: Path):
    """The shipped recipe cut to ``steps`` optimizer steps of pairs (same batch, so 8 pairs a step) of one run (the
    recipe averages several: its ``embedding.soup``), writing to ``output_dir``. Its chunk teacher's documents
    keep their proportion to the pairs, in whole batches, their steps on top as in the recipe."""
    shipped = load_recipe(_demo_file())[0]
    batch, e = shipped.train.batch_size, shipped.embedding
    chunk_batches = round(e.chunk_teacher * steps / e.pairs)
    overrides = {
        "train.max_steps": steps + chunk_batches,
        "train.output_dir": str(output_dir),
        "embedding.pairs": steps * batch,
        "embedding.chunk_teacher": chunk_batches * batch,
        "embedding.soup": 1,
    }
    return load_recipe(_demo_file(), [f"{key}={value}" for key, value in overrides.items()])


def _demo_file() -> Path:
    """The shipped recipe's file, by path: a file of that name in the working folder is not the demo's."""
    return shipped_recipes()[DEMO_RECIPE]


def trained_model(steps: int, run_dir: Path, overwrite: bool, timings: dict) -> Path:
    """Train the shortened recipe into ``run_dir``, or reuse the model a run of the same recipe left there."""
    recipe, raw = demo_recipe(steps, run_dir)
    model_dir = run_dir / "model"
    if _same_recipe(run_dir, recipe) and (model_dir / "modules.json").is_file() and not overwrite:
        print(f"Reusing the model trained earlier with the same recipe: {model_dir} (--overwrite trains again).")
        return model_dir
    print(
        f"Training the patched model for {steps} steps of {recipe.train.batch_size} pairs"
        + (f" and {recipe.train.max_steps - steps} of its chunk teacher" if recipe.train.max_steps > steps else "")
        + f" ({DEMO_RECIPE}, shortened to one run of the several it averages): {recipe.train.max_steps} on the train bar."
    )
    start = time.perf_counter()
    ours = (run_dir / "recipe.json").is_file()  # an earlier demo's run folder: its model may be replaced
    trained = train(recipe, raw, overwrite=overwrite or ours)
    timings["train_seconds"] = round(time.perf_counter() - start, 1)
    print(f"Trained in {timings['train_seconds']:.0f} s.")
    return trained


def _same_recipe(run_dir: Path, recipe) -> bool:
    saved = run_dir / "recipe.json"
    try:
        stored = json.loads(saved.read_text())
        if isinstance(stored, dict):
            stored.pop("recipe_file", None)  # where it was read from: the same recipe either way
        return stored == json.loads(json.dumps(recipe.to_dict()))
    except (OSError, ValueError):
        return False


def run_demo(
    steps: int = 12,
    documents: int = 30,
    task: str = "passkey",
    output_dir: str | Path = "out/demo",
    overwrite: bool = False,
) -> RetrievalResults:
    """Patch, train, score; print one table and write ``output_dir/results/retrieval.json`` and its plot.
    ``steps=0`` scores the patched model untrained only."""
    if steps < 0:
        raise ValueError(f"--steps must be >= 0 (0: the patched model untrained only); got {steps}.")
    check_retrieval_inputs(task, DEFAULT_LENGTHS, documents, 8, None)  # --documents, --task: before any work
    check_output_dir(Path(output_dir) / "results")  # a file where the results go: one line, before any training
    output_dir, start = Path(output_dir), time.perf_counter()
    run = {"steps": steps, "documents": documents, "task": task, "train_seconds": None, "load_before": _load()}
    recipe, _ = demo_recipe(max(steps, 1), output_dir / "train")  # checks the recipe before any work
    with quiet_transformers():
        stock = load_embedding_model(recipe.model)
        untrained = load_embedding_model(recipe.model)
        patch(untrained, recipe.posswap)
        models = {"stock": stock, "patched": untrained}
        if steps:
            models["trained"] = load_embedding_model(str(trained_model(steps, output_dir / "train", overwrite, run)))
    print(f"Scoring {task} retrieval: {documents} documents per length, each model and baseline.")
    results = evaluate_retrieval(models, task, list(DEFAULT_LENGTHS), documents, baselines=BASELINES)
    results.save(output_dir / "results")
    run |= {"wall_seconds": round(time.perf_counter() - start, 1), "load_after": _load(), "cpus": os.cpu_count()}
    (output_dir / "results" / "demo.json").write_text(json.dumps(run, indent=1) + "\n")
    print(results.table())
    print(verdict(results, "trained" if steps else "patched"))
    print(
        f"Wrote {output_dir / 'results'}: retrieval.json, retrieval.png, demo.json (timings). The full recipe: posswap train {DEMO_RECIPE}."
    )
    return results


def _load() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages: a timing on a busy machine says so."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def verdict(results: RetrievalResults, name: str) -> str:
    """One line at the longest length: the one patched vector against the stock model's chunks."""
    length, chunk = results.lengths[-1], results.models["stock"].limit
    chunk_max = f"stock chunk-max@{chunk}"
    chunks = -(-length // chunk)

    def at(column: str) -> float:
        return results.models[column].accuracy[-1]

    return (
        f"At {length} tokens: one {name} vector finds {at(name):.2f}, the stock model {at('stock'):.2f} "
        f"(it truncates), and {at(chunk_max):.2f} keeping {chunks} chunk vectors per document ({chunk_max})."
    )
