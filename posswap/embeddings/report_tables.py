"""The long-embedding tables of the README and docs/embeddings.md from the results JSON (nothing typed by hand),
written with every generated block by ``python -m posswap.cli.generate --write``::

    python -m posswap.embeddings.report_tables [--task needle] [--results results/embeddings]  # print one table
    python -m posswap.embeddings.report_tables --plots     # draw results/embeddings/{passkey,needle}.png again

A generated block sits between ``<!-- posswap:embeddings-NAME -->`` and ``<!-- /posswap:embeddings-NAME -->``
(NAME: ``passkey``, ``needle``, ``speed``, ``demo`` (the committed ``posswap demo`` run, ``results/demo/``),
``passkey-chunking`` and ``needle-chunking`` (chunk baselines and late chunks), ``chunking-verdict`` (both tasks'
verdict lines, over every committed run: :func:`every_run`)); writing replaces what is between them and nothing else.

Reads ``<results>/untrained/retrieval.json`` (stock MiniLM and each extension untrained),
``<results>/trained/stride-untrained/retrieval.json`` (the stride placement, untrained) and
``<results>/trained/retrieval.json`` (after ``posswap train recipes/minilm-embed-2k.yaml``) with the run's
``training.json``; the files must hold the same documents (same task, lengths, seed and fingerprints).
Then: the target at the longest length, and what training cost at each length up to the stock model's limit
(a fall larger than the stock model's standard error is named as such).

A run trained again with other seeds (``trained-seed1/``: a model named ``<name>-seed1``) joins its first run
(``<name>``, or ``<name>-seed0``) in one column, ``<name> (n seeds)``: the mean and the standard deviation over
the seeds instead of one run's standard error.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from ..files import shown_command
from . import verdicts
from .report_speed import bias_memory_block, gpu_block, graph_block, kernels_block, speed_block
from .verdicts import best_per_length

ROOT = Path(__file__).resolve().parents[2]  # the clone: results/ and the pages live there
RESULTS, SPEED = ROOT / "results" / "embeddings", ROOT / "results" / "speed"
CONTEXT = "context"  # results/context/<run>/{passkey,needle}: the late recipe's seeds (minilm-late-2k)
TARGET = 0.8  # issue 23: passkey accuracy at 4x the original length after training
# Untrained models first: the stock model and the extensions (the retrieval evaluation's run, one folder per task),
# then the stride placement; then the recipe's runs (copy init as the recipe says, and stride init with --set).
UNTRAINED = ("untrained/{task}", "trained/stride-untrained")
TRAINED = (
    "trained-chunks64-soup",
    "trained-chunks64",
    "trained-soup",
    "trained-soup8-seeds0-7",
    "trained-soup8-seeds4-11",
    "trained-soup12",
    "trained-exact",
    "trained-teacher",
    "trained-stride",
    "trained",
)  # then any other trained-*
# The runs of the recipe as shipped (four runs with the chunk teacher averaged; trained-chunks64*/ holds single
# runs of it, trained-soup*/ the soups before the chunk teacher, trained/ the copy init it had first): the
# README's verdict.
RECIPE_RUN = "trained-chunks64-soup"
# A run's batches besides the pairs (the trainer takes them in turn): the recipe keys that add them.
TEACHERS = {"teacher": "teacher's texts", "chunk_teacher": "chunk teacher's documents"}
# The stock model's chunk baselines (posswap eval posswap:minilm --baselines chunk-mean chunk-max), and the long
# models with their late chunks (--baselines late-chunk-max), on the same documents.
CHUNKING = ("baselines/{task}", "late-chunks/{task}")
LONG_RECIPE = "embeddings-4k"  # beside the 2k results: minilm-embed-4k, one run, both tasks, to 4096 tokens
STOCK = "minilm-512"  # the stock weights reading 512 tokens (the shipped folder says 256: minilm)


def load(folder: Path) -> dict:
    return json.loads((folder / "retrieval.json").read_text())


def merged(untrained: dict, trained: dict) -> dict:
    """One results mapping with the models of both files, refused unless they scored the same documents."""
    for key in ("task", "lengths", "documents", "seed"):
        if untrained[key] != trained[key]:
            raise SystemExit(f"report: the two files differ in {key}: {untrained[key]} vs {trained[key]}.")
    if untrained["settings"].get("fingerprints") != trained["settings"].get("fingerprints"):
        raise SystemExit("report: the two files scored different documents (fingerprints differ).")
    # A model both files scored alike (the stock model beside its chunk baselines) is one column.
    same = sorted(
        name
        for name in set(untrained["models"]) & set(trained["models"])
        if untrained["models"][name] != trained["models"][name]
    )
    if same:  # one column would silently replace the other
        raise SystemExit(f"report: two results files both name a model {same[0]!r}; rename one.")
    return {**untrained, "models": {**untrained["models"], **trained["models"]}}


SEED = re.compile(r"^(?P<base>.+)-seed(?P<seed>\d+)(?P<kind>( \S+@\d+)?)$")  # a run's seed, then its column's kind


def is_seed_of(name: str, run: str) -> bool:
    """``run-seedN``: the same recipe as ``run`` with another seed (not ``run8-seedN``, another recipe's)."""
    match = SEED.match(name)
    return bool(match) and match["base"] == run and not match["kind"]


def seed_groups(results: dict) -> dict:
    """``results`` with each model trained with several seeds as one entry, ``<name> (n seeds)`` (its late chunks:
    ``<name> (n seeds) late-chunk-max@N``): accuracy the mean over the seeds, ``stderr`` their standard deviation
    (where the group's first model stood)."""
    models = results["models"]
    groups: dict[str, list[str]] = {}
    for name in models:
        match = SEED.match(name)
        joins = match and any(f"{match['base']}{s}{match['kind']}" in models for s in ("", "-seed0"))
        groups.setdefault((match["base"], match["kind"]) if joins else (name, ""), []).append(name)
    grouped = {}
    for (base, kind), names in groups.items():
        if len(names) == 1:
            grouped[names[0]] = models[names[0]]
            continue
        runs = [models[n]["accuracy"] for n in names]
        grouped[f"{base} ({len(names)} seeds){kind}"] = {
            **models[names[0]],
            "accuracy": [statistics.mean(values) for values in zip(*runs)],
            "stderr": [statistics.stdev(values) for values in zip(*runs)],
            "lowest": [min(values) for values in zip(*runs)],  # the worst seed's, for the cost at short lengths
        }
    return {**results, "models": grouped}


def table(results: dict) -> list[str]:
    """A row per model, a column per length: twenty runs are twenty rows, never twenty columns a screen cannot
    show (tools/check_docs_layout.py)."""
    lengths = results["lengths"]
    lines = ["| model \\ tokens | " + " | ".join(map(str, lengths)) + " |", "|---|" + "---|" * len(lengths)]
    for name, m in results["models"].items():
        cells = [f"{m['accuracy'][i]:.2f} ± {m['stderr'][i]:.2f}" for i in range(len(lengths))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def target_lines(results: dict, stock: str, trained: str) -> list[str]:
    """The target at the longest length, and the cost at each length the stock model reads whole."""
    lengths, models = results["lengths"], results["models"]
    base, after = models[stock], models[trained]
    last = len(lengths) - 1
    reached = "reached" if after["accuracy"][last] >= TARGET else "not reached"
    lines = [
        f"- At {lengths[last]} tokens, {trained}: {after['accuracy'][last]:.2f} ± {after['stderr'][last]:.2f} "
        f"(target {TARGET}: {reached}); {stock}: {base['accuracy'][last]:.2f} ± {base['stderr'][last]:.2f}."
    ]
    for i, length in enumerate(lengths):
        if base["limit"] is not None and length > base["limit"]:
            continue
        change = after["accuracy"][i] - base["accuracy"][i]
        line = (
            f"- At {length} tokens, {trained}: {change:+.2f} against {stock} ({fall(change, base['stderr'][i])}; "
            f"{stock}'s standard error {base['stderr'][i]:.2f})"
        )
        if "lowest" in after:
            lowest = after["lowest"][i] - base["accuracy"][i]
            line += f"; its lowest seed {lowest:+.2f} ({fall(lowest, base['stderr'][i])})"
        lines.append(line + ".")
    return lines


def fall(change: float, stderr: float) -> str:
    return "no fall" if change >= 0 else "a fall within" if change >= -stderr else "a fall beyond"


def quarter(losses: list[float]) -> str:
    return f"{sum(losses) / len(losses):.3f}" if losses else "n/a"


def training_line(path: Path) -> str | None:
    if not path.is_file():
        return None
    run = json.loads(path.read_text())
    soup = run["recipe"].get("embedding", {}).get("soup", 1)  # runs averaged, their losses one after the other
    each = len(run["losses"]) // soup
    losses = [run["losses"][i * each : (i + 1) * each] for i in range(soup)]
    part = max(1, each // 4)  # at least one step at each end
    block = run["recipe"].get("posswap") or {}
    init = block.get("mode") or block.get("method") or "unpatched"  # the command alone does not say: defaults change
    cpu = f"{run['cpu_seconds'] / 60:.1f} min of CPU" if run.get("cpu_seconds") is not None else "CPU time not recorded"
    runs = f"{soup} runs (averaged) of " if soup > 1 else ""
    embedding = run["recipe"].get("embedding", {})
    teachers = [f"the {what} ({embedding[k]})" for k, what in TEACHERS.items() if embedding.get(k)]
    batches = "(passage, document) pairs" + (f", in turn with {' and '.join(teachers)}" if teachers else "")
    return (
        f"- Training ({path.parent.name}, {init} init): `{shown_command(run['command'])}`: {runs}{run['steps']} steps of {run['batch_size']} {batches}, "
        f"{run['wall_seconds'] / 60:.1f} min wall ({cpu}) on {run['machine']}; "
        f"loss, mean of the first and of the last quarter of the steps{' of each run' if soup > 1 else ''}: "
        f"{quarter([x for r in losses for x in r[:part]])} -> {quarter([x for r in losses for x in r[-part:]])}."
    )


def merged_results(root: Path, task: str) -> tuple[dict, list[Path], tuple[str, ...]]:
    """Every model scored on ``task`` in one mapping (untrained first, then the recipe's runs), the folders read
    and the recipe's run folders."""
    runs = TRAINED + tuple(sorted(p.name for p in root.glob("trained-*") if p.name not in TRAINED))
    folders = [root / f.format(task=task) for f in UNTRAINED] + run_folders(root, runs, task)
    found = [f for f in folders if (f / "retrieval.json").is_file() and load(f)["task"] == task]
    if not found:
        raise SystemExit(f"report: no {task} results in {root}; run the evaluation first.")
    results = load(found[0])
    for folder in found[1:]:
        results = merged(results, load(folder))
    return seed_groups(results), found, runs


def run_folders(root: Path, runs, task: str) -> list[Path]:
    """Where a run's results on ``task`` may be: its folder (the passkey runs), or ``<run>/<task>``."""
    return [folder for run in runs for folder in (root / run, root / run / task)]


def plot_all(root: Path, task: str) -> Path:
    """``<root>/<task>.png``: accuracy against length for every model in the table (the evaluation's own plot)."""
    from posswap.embeddings.retrieval import RetrievalResults, plot_retrieval

    results, _, _ = merged_results(root, task)
    for model in results["models"].values():
        model.pop("lowest", None)  # the table's, not a field of the evaluation's own results
    return plot_retrieval(RetrievalResults.from_dict(results), root / f"{task}.png")


def retrieval_block(root: Path, task: str) -> list[str]:
    """The table of every model scored on ``task`` (untrained, then the recipe's runs), then each run's verdict
    against the target and its training line."""
    results, found, runs = merged_results(root, task)
    names = list(results["models"])
    # The untrained folders' models (a run's needle results sit in <run>/needle/: the folder name does not say).
    before = {root / f.format(task=task) for f in UNTRAINED}
    untrained = {name for folder in found if folder in before for name in load(folder)["models"]}
    trained = [name for name in names if name not in untrained and "untrained" not in name]
    lines = [*table(results), "", caption(results)]
    if not trained:
        return lines
    lines.append("")
    stock = next((n for n in names if n.startswith(STOCK)), names[0])
    for name in trained:
        lines += target_lines(results, stock, name)
    return lines + [line for folder in runs if (line := training_line(root / folder / "training.json"))]


def late_recipe_runs(root: Path, task: str) -> list[dict]:
    """The late recipe's runs scored on ``task`` (``results/context/<run>/<task>``, a seed each), their columns named
    after the run: ``model`` -> ``<run>``, ``model late-chunk-max@N`` -> ``<run> late-chunk-max@N``."""
    found = []
    for folder in sorted((root.parent / CONTEXT).glob(f"*/{task}")):
        if (folder / "retrieval.json").is_file():
            data, run = load(folder), folder.parent.name
            rename = {name: run + name[len("model") :] for name in data["models"] if name.split(" ")[0] == "model"}
            found.append({**data, "models": {rename.get(n, n): m for n, m in data["models"].items()}})
    return found


def slim(results: dict, lengths: list[int] | None = None) -> dict:
    """``results`` with each column's limit, accuracy and standard error only, at ``lengths`` (default: its own; a
    run that reads further is scored on the same documents at the shorter lengths)."""
    lengths = lengths or results["lengths"]
    index = [results["lengths"].index(n) for n in lengths]
    prints = results["settings"].get("fingerprints") or {}
    models = {
        name: {"limit": m["limit"], **{key: [m[key][i] for i in index] for key in ("accuracy", "stderr")}}
        for name, m in results["models"].items()
    }
    settings = {"fingerprints": {str(n): prints.get(str(n)) for n in lengths}}
    return {**results, "lengths": lengths, "models": models, "settings": settings}


def every_run(root: Path, task: str) -> dict:
    """Every committed run scored on ``task`` on the same documents, one column each (a recipe's seeds joined): the
    untrained models and every minilm-embed-2k run (as :func:`merged_results` reads them), the stock model's chunk
    baselines and the long models' late chunks, minilm-late-2k's seeds (``results/context/``) and minilm-embed-4k at
    these lengths (``results/embeddings-4k/``). The verdicts of the README and the docs are computed over these."""
    runs = TRAINED + tuple(sorted(p.name for p in root.glob("trained-*") if p.name not in TRAINED))
    folders = [root / f.format(task=task) for f in (*UNTRAINED, *CHUNKING)] + run_folders(root, runs, task)
    found = [load(f) for f in folders if (f / "retrieval.json").is_file() and load(f)["task"] == task]
    found += late_recipe_runs(root, task)
    if ((long := root.parent / LONG_RECIPE / task) / "retrieval.json").is_file():
        found.append(load(long))
    if not found:
        raise SystemExit(f"report: no {task} results in {root}; run the evaluation first.")
    results = slim(found[0])
    for other in found[1:]:
        if set(results["lengths"]) <= set(other["lengths"]):
            results = merged(results, slim(other, results["lengths"]))
    return seed_groups(results)


def chunking_block(root: Path, task: str) -> list[str]:
    """The stock model's chunk baselines beside the shipped recipes' one vector and their late chunks (each recipe's
    seeds as one column), then per length which way wins over every committed run (:func:`every_run`)."""
    folders = [root / f.format(task=task) for f in CHUNKING]
    missing = [str(f) for f in folders if not (f / "retrieval.json").is_file()]
    if missing:
        raise SystemExit(f"report: no {task} results in {', '.join(missing)}; run the evaluation first.")
    results = merged(load(folders[0]), load(folders[1]))
    # The shipped recipes' runs (one column, its seeds' mean and spread), where they were scored on this task.
    recipe = sorted(
        p.name for p in root.glob(f"{RECIPE_RUN}*") if p.name == RECIPE_RUN or is_seed_of(p.name, RECIPE_RUN)
    )
    for folder in run_folders(root, recipe, task):
        if (folder / "retrieval.json").is_file() and load(folder)["task"] == task:
            results = merged(results, load(folder))
    results = slim(results)
    for run in late_recipe_runs(root, task):
        results = merged(results, slim(run))
    results = seed_groups(results)
    chunk = sorted({n.rsplit("@", 1)[1] for n in results["models"] if "@" in n})  # the columns say the size
    sizes = f"`@{'`, `@'.join(chunk)}`: chunks of that many tokens, the stock model's limit; " if chunk else ""
    what = (
        "chunk-mean keeps one vector per document (the mean of its chunks'), chunk-max and late-chunk-max one per "
        "chunk (a document scores its best chunk)."
    )
    return [*table(results), "", caption(results, sizes + what), "", verdict_line(root, task)]


def verdict_line(root: Path, task: str) -> str:
    """Which way of keeping a long document finds it most often at each length, over every committed run."""
    runs = every_run(root, task)
    return best_per_length(runs, f"every committed run: {len(runs['models'])} columns")


def caption(results: dict, more: str = "") -> str:
    """The line under a results table: metric, documents, chance, seed, what a column of seeds shows, and ``more``."""
    seeds = any(" seeds)" in name for name in results["models"])
    return " ".join(
        part
        for part in (
            f"{results['task']} retrieval, accuracy at 1 ± standard error, {results['documents']} documents per "
            f"length (chance {1 / results['documents']:.2f}), seed {results['seed']}.",
            more,
            "A row of n seeds: mean ± standard deviation over n trainings of the recipe with different seeds."
            if seeds
            else "",
        )
        if part
    )


def verdict_block(root: Path) -> list[str]:
    """Both tasks' verdict lines, for the README."""
    return [f"- {verdict_line(root, task)}" for task in ("passkey", "needle")]


def demo_block(root: Path) -> list[str]:
    """The committed ``posswap demo`` run (``results/demo/``: its retrieval.json, context.json and demo.json): the
    table and the verdict it printed (:mod:`.verdicts`, from the figures, about the demo's own model), and what it
    took."""
    from .context_retrieval import ContextResults
    from .retrieval import RetrievalResults

    results = load(root)
    run = json.loads((root / "demo.json").read_text())
    name = "trained" if run["steps"] else "patched"
    haystack = results["settings"].get("haystack", "filler")
    where = "LongEmbed's synthetic filler" if haystack == "filler" else f"held-out prose ({haystack.capitalize()})"
    context = [verdicts.context_line(ContextResults.load(root), name)] if (root / "context.json").is_file() else []
    load_average = "/".join(f"{x:.2f}" for x in run["load_before"]) if run.get("load_before") else "not recorded"
    trained = f"{run['train_seconds']:.0f} s of it training" if run.get("train_seconds") else "no training"
    also = f", {run['context_documents']} of the context task" if run.get("context_documents") else ""
    steps = run.get("train_steps", run["steps"])
    return [
        *table(results),
        "",
        caption(results, f"The needle in {where}."),
        "",
        verdicts.verdict(RetrievalResults.from_dict(results), name, verdicts.demo_model(steps)),
        *(["", *context] if context else []),
        "",
        f"`posswap demo` ({steps} training steps, {run['documents']} documents per length{also}): "
        f"{run['wall_seconds'] / 60:.1f} minutes on {run['cpus']} cores, {trained} (load average before the run "
        f"{load_average}; `results/demo/`).",
    ]


def long_recipe_block(root: Path) -> list[str]:
    """The 4096-token recipe (``results/embeddings-4k/``): per task its table beside the stock model's chunks and
    its own late chunks, the line that says which wins per length, and the training run."""
    lines: list[str] = []
    for task in ("passkey", "needle"):
        folder = root / task
        if (folder / "retrieval.json").is_file():
            results = load(folder)
            verdict = best_per_length(results, "the 4096-token recipe's run")
            lines += [*table(results), "", caption(results), "", verdict, ""]
    return [*lines, *filter(None, [training_line(root / "training.json")])]


def blocks(results: Path = RESULTS, speed: Path = SPEED) -> dict[str, list[str]]:
    """Every ``embeddings-NAME`` block, by NAME, from ``results`` (results/embeddings) and its neighbours."""
    chunking = {
        f"{task}-chunking": chunking_block(results, task)
        for task in ("passkey", "needle")
        if all((results / f.format(task=task)).is_dir() for f in CHUNKING)
    }
    verdict = {"chunking-verdict": verdict_block(results)} if len(chunking) == 2 else {}
    return {
        **chunking,
        **verdict,
        "passkey": retrieval_block(results, "passkey"),
        "needle": retrieval_block(results, "needle"),
        "speed": speed_block(speed),
        **({"gpu": gpu_block(gpu)} if (gpu := results.parent / "gpu").is_dir() else {}),
        **({"demo": demo_block(results.parent / "demo")} if (results.parent / "demo" / "demo.json").is_file() else {}),
        **({"onnx-int8": graph_block(onnx)} if (onnx := results.parent / "onnx").is_dir() else {}),
        **({"onnx-bias": graph_block(bias)} if (bias := results.parent / "onnx-bias").is_dir() else {}),
        **({"onnx-bias-memory": bias_memory_block(bias)} if list(bias.glob("memory-*.json")) else {}),
        **({"onnx-kernels": kernels_block(speed)} if list(speed.glob("onnx-kernels-*.json")) else {}),
        **(
            {"4k": long_recipe_block(long)}
            if ((long := results.parent / LONG_RECIPE) / "training.json").is_file()
            else {}
        ),
    }


def rewritten(text: str, generated: dict[str, list[str]], path: str) -> str:
    """``text`` with every generated block it holds replaced; a start marker without its end is an error."""
    for name, lines in generated.items():
        start, end = f"<!-- posswap:embeddings-{name} -->", f"<!-- /posswap:embeddings-{name} -->"
        if start not in text:
            continue
        if end not in text:
            raise SystemExit(f"report: {path} has {start} but no {end}.")
        head, rest = text.split(start, 1)
        text = head + start + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="passkey", choices=("passkey", "needle"))
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--plots", action="store_true", help="draw <results>/passkey.png and needle.png again")
    args = parser.parse_args(argv)
    if args.plots:
        for task in ("passkey", "needle"):
            print(plot_all(Path(args.results), task))
        return 0
    print("\n".join(retrieval_block(Path(args.results), args.task)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
