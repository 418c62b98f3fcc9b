"""``posswap demo``: the README's first command, on the real all-MiniLM-L6-v2 (a sentence-transformers model with
512 learned positions, which it reads 256 at a time). Patch it to read 2048 tokens with the shipped embedding
recipe's placement, train it briefly with that recipe, and score passkey (or needle) retrieval with the needle in
held-out prose (*Persuasion*; ``haystack="filler"``: LongEmbed's synthetic filler) against what a user with a vector
database does today: truncate, or cut each document into chunks the stock model reads; the trained model's late
chunks beside them. The verdict is computed from the figures (:func:`verdict`), whichever way they point; a short
context task (:func:`context_line`) asks for facts whose chunk does not name its subject."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .embeddings.context_retrieval import (
    DEFAULT_CHUNK_TOKENS,
    ContextResults,
    check_context_inputs,
    evaluate_context,
)
from .embeddings.retrieval import (
    DEFAULT_LENGTHS,
    RetrievalResults,
    check_retrieval_inputs,
    evaluate_retrieval,
    load_embedding_model,
)
from .embeddings.verdicts import context_line, demo_model, haystack_name, verdict
from .files import check_output_dir
from .loading import quiet_transformers
from .patching import patch
from .shipped_recipes import shipped_recipes
from .training.loop import train
from .training.recipe import load_recipe

DEMO_RECIPE = "minilm-embed-2k"  # the shipped recipe the demo shortens: posswap train minilm-embed-2k is the full run
BASELINES = ["chunk-max", "late-chunk-max"]  # the stock model's chunks, the long model's late chunks
# The needle's haystack: Persuasion, running prose no recipe trains on (the default), or LongEmbed's synthetic filler
# ('The grass is green. The sky is blue. ...' repeated), where any inserted sentence stands out.
HAYSTACKS = ("persuasion", "filler")
CONTEXT_LENGTH, CONTEXT_DOCUMENTS = 1024, 40  # the short context task: a length the stock model reads in 4 chunks


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
    out: str | Path = "out/demo",
    overwrite: bool = False,
    haystack: str = "persuasion",
    context_documents: int = CONTEXT_DOCUMENTS,
) -> RetrievalResults:
    """Patch, train, score; print the table and the verdict, and write ``out/results/``: retrieval.json,
    its plot, context.json (the context task, unless ``context_documents=0``) and demo.json (timings).
    ``steps=0`` scores the patched model untrained only."""
    check_demo_inputs(steps, documents, task, haystack, context_documents)
    check_output_dir(Path(out) / "results")  # a file where the results go: one line, before any training
    out, start = Path(out), time.perf_counter()
    run = {"steps": steps, "documents": documents, "task": task, "haystack": haystack}
    run |= {"context_documents": context_documents, "train_seconds": None, "load_before": _load()}
    recipe, _ = demo_recipe(max(steps, 1), out / "train")  # checks the recipe before any work
    run["train_steps"] = recipe.train.max_steps if steps else 0  # pairs and chunk teacher: what the verdict is about
    name, models = _demo_models(recipe, steps, out / "train", overwrite, run)
    print(f"Scoring {task} retrieval, the needle in {haystack_name(haystack)}: {documents} documents per length.")
    results = evaluate_retrieval(models, task, list(DEFAULT_LENGTHS), documents, haystack=haystack, baselines=BASELINES)
    results.save(out / "results")
    context = _context(models, name, context_documents, out / "results")
    run |= {"wall_seconds": round(time.perf_counter() - start, 1), "load_after": _load(), "cpus": os.cpu_count()}
    (out / "results" / "demo.json").write_text(json.dumps(run, indent=1) + "\n")
    print(results.table())
    print(verdict(results, name, demo_model(run["train_steps"])))
    if context is not None:
        print(context_line(context, name))
    print(
        f"Wrote {out / 'results'}: retrieval.json, retrieval.png, "
        + ("context.json, " if context is not None else "")
        + f"demo.json (timings). The full recipe: posswap train {DEMO_RECIPE}."
    )
    return results


def check_demo_inputs(steps: int, documents: int, task: str, haystack: str, context_documents: int) -> None:
    """One line naming the flag, before any work."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"--steps must be a whole number >= 0 (0: the patched model untrained only); got {steps!r}.")
    if haystack not in HAYSTACKS:
        raise ValueError(f"--haystack must be one of {', '.join(HAYSTACKS)}; got {haystack!r}.")
    try:
        check_retrieval_inputs(task, DEFAULT_LENGTHS, documents, 8, haystack)
    except ValueError as error:  # the evaluation names its arguments; the demo's user typed flags
        raise ValueError(f"--{error}") from None
    if context_documents != 0:
        try:
            check_context_inputs([CONTEXT_LENGTH], context_documents, DEFAULT_CHUNK_TOKENS, 8)
        except ValueError as error:
            raise ValueError(f"--context-{error.args[0].rstrip('.')} (0: no context task).") from None


def _demo_models(recipe, steps: int, run_dir: Path, overwrite: bool, timings: dict) -> tuple[str, dict]:
    """The one vector's name and the models scored: the stock model first (its chunks are the baseline), then
    the trained model (``steps`` > 0) or the patched one untrained."""
    with quiet_transformers():
        stock = load_embedding_model(recipe.model)
        if steps:
            trained = trained_model(steps, run_dir, overwrite, timings)
            return "trained", {"stock": stock, "trained": load_embedding_model(str(trained))}
        patched = patch(load_embedding_model(recipe.model), recipe.posswap)
        return "patched", {"stock": stock, "patched": patched}


def _context(models: dict, name: str, documents: int, folder: Path) -> ContextResults | None:
    """The context task at :data:`CONTEXT_LENGTH` tokens (``documents`` of them; 0: none), saved to ``folder``."""
    if not documents:
        return None
    print(f"Scoring facts whose chunk does not name its subject: {documents} documents of {CONTEXT_LENGTH} tokens.")
    context = evaluate_context(
        {"stock": models["stock"], name: models[name]}, [CONTEXT_LENGTH], documents, baselines=BASELINES
    )
    context.save(folder)
    return context


def _load() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages: a timing on a busy machine says so."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
