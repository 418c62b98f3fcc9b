"""Print the README's long-embedding table from the results JSON (nothing typed by hand):

    python tools/readme_embeddings.py [--task passkey] [--results results/embeddings]
    python tools/readme_embeddings.py --write README.md docs/embeddings.md   # rewrite their generated blocks
    python tools/readme_embeddings.py --check README.md docs/embeddings.md   # exit 1 when a block differs

A generated block sits between ``<!-- posswap:embeddings-NAME -->`` and ``<!-- /posswap:embeddings-NAME -->``
(NAME: ``passkey``, ``needle``, ``speed``, ``demo`` (the committed ``posswap demo`` run, ``results/demo/``), ``passkey-chunking`` and ``needle-chunking`` (chunk baselines and late
chunks), ``chunking-verdict`` (both tasks' verdict lines), and ``passkey-summary``: the passkey table with the
verdict on the recipe's runs only, for the README); ``--write`` replaces what is between them and nothing else.

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
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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
            raise SystemExit(f"readme_embeddings: the two files differ in {key}: {untrained[key]} vs {trained[key]}.")
    if untrained["settings"].get("fingerprints") != trained["settings"].get("fingerprints"):
        raise SystemExit("readme_embeddings: the two files scored different documents (fingerprints differ).")
    # A model both files scored alike (the stock model beside its chunk baselines) is one column.
    same = sorted(
        name
        for name in set(untrained["models"]) & set(trained["models"])
        if untrained["models"][name] != trained["models"][name]
    )
    if same:  # one column would silently replace the other
        raise SystemExit(f"readme_embeddings: two results files both name a model {same[0]!r}; rename one.")
    return {**untrained, "models": {**untrained["models"], **trained["models"]}}


SEED = re.compile(r"^(?P<base>.+)-seed(?P<seed>\d+)$")


def is_seed_of(name: str, run: str) -> bool:
    """``run-seedN``: the same recipe as ``run`` with another seed (not ``run8-seedN``, another recipe's)."""
    match = SEED.match(name)
    return bool(match) and match["base"] == run


def seed_groups(results: dict) -> dict:
    """``results`` with each model trained with several seeds as one entry, ``<name> (n seeds)``: accuracy the
    mean over the seeds, ``stderr`` their standard deviation (where the group's first model stood)."""
    models = results["models"]
    groups: dict[str, list[str]] = {}
    for name in models:
        match = SEED.match(name)
        first = match and (match["base"] in models or f"{match['base']}-seed0" in models)  # the run it joins
        base = match["base"] if first else name
        groups.setdefault(base, []).append(name)
    grouped = {}
    for base, names in groups.items():
        if len(names) == 1:
            grouped[names[0]] = models[names[0]]
            continue
        runs = [models[n]["accuracy"] for n in names]
        grouped[f"{base} ({len(names)} seeds)"] = {
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


def verdict(results: dict, stock: str, trained: str) -> list[str]:
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
        f"- Training ({path.parent.name}, {init} init): `{run['command']}`: {runs}{run['steps']} steps of {run['batch_size']} {batches}, "
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
        raise SystemExit(f"readme_embeddings: no {task} results in {root}; run the evaluation first.")
    results = load(found[0])
    for folder in found[1:]:
        results = merged(results, load(folder))
    return seed_groups(results), found, runs


def run_folders(root: Path, runs, task: str) -> list[Path]:
    """Where a run's results on ``task`` may be: its folder (the passkey runs), or ``<run>/<task>``."""
    return [folder for run in runs for folder in (root / run, root / run / task)]


def plot_all(root: Path, task: str) -> Path:
    """``<root>/<task>.png``: accuracy against length for every model in the table (the evaluation's own plot)."""
    from posswap.evaluation.retrieval import RetrievalResults, plot_retrieval

    results, _, _ = merged_results(root, task)
    for model in results["models"].values():
        model.pop("lowest", None)  # the table's, not a field of the evaluation's own results
    return plot_retrieval(RetrievalResults.from_dict(results), root / f"{task}.png")


def retrieval_block(root: Path, task: str, summary: bool = False) -> list[str]:
    """The table of every model scored on ``task`` (untrained, then the recipe's runs), then the verdicts
    (``summary``: on the shipped recipe's runs only, without the training lines)."""
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
    if summary:
        recipe = next(iter(load(root / RECIPE_RUN)["models"]))
        trained = [name for name in trained if name == recipe or name.startswith(f"{recipe} (")]
    for name in trained:
        lines += verdict(results, stock, name)
    if not summary:
        lines += [line for folder in runs if (line := training_line(root / folder / "training.json"))]
    return lines


def speed_block(root: Path) -> list[str]:
    """Time and peak memory against stock at each length and pass (bench_methods' JSON: forward, or forward and
    backward), then the embedding throughput of the patched MiniLM against the stock model reading 512-token pieces
    (bench_embeddings')."""
    lines = [
        "| run | length | pass | variant | time vs stock | same-round time vs stock | memory vs stock |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(root.glob("*.json")):
        run = json.loads(path.read_text())
        for row in run.get("rows", []):
            if row["variant"] != "stock":
                lines.append(
                    f"| `{path.stem}` | {row['length']} | {row['pass']} | {row['variant']} | {row['time_vs_stock']:.2f} | "
                    f"{row['time_vs_stock_paired']:.2f} | {row['memory_vs_stock']:.2f} |"
                )
    lines += [
        "",
        "| run | model | tokens/s | time vs stock pieces | memory vs stock pieces | vectors per document |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted(root.glob("embeddings-*.json")):
        for name, row in json.loads(path.read_text())["results"].items():
            vectors = row.get("vectors_per_document", 4 if name == "stock-512" else 1)  # runs before it was recorded
            lines.append(
                f"| `{path.stem}` | {name} | {row['tokens_per_s']:,.0f} | {row['time_vs_stock']:.2f} | "
                f"{row['memory_vs_stock']:.2f} | {vectors:g} |"
            )
    lines += onnx_lines(root)
    commands = [json.loads(p.read_text())["command"] for p in sorted(root.glob("*.json"))]
    return [*lines, "", "Each run's command (`results/speed/`): " + "; ".join(f"`{c}`" for c in commands) + "."]


def onnx_lines(root: Path) -> list[str]:
    """The exported graph (posswap export --format onnx) against the torch model it came from, in the same rounds:
    documents per second over the torch model's, and the load average around the run (a shared machine)."""
    lines = [
        "",
        "| run | tokens, threads | variant | documents/s vs torch exact-2048 | same rounds | peak MiB | load |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(root.glob("embeddings-*.json")):
        run = json.loads(path.read_text())
        torch_row = run["results"].get("exact-2048")
        if torch_row is None:
            continue
        load_average = "{:.1f} / {:.1f}".format(run["load_average"]["before"][0], run["load_average"]["after"][0])
        for name, row in run["results"].items():
            if "onnx" in name:
                paired = statistics.median(t / r for t, r in zip(torch_row["times"], row["times"]))
                lines.append(
                    f"| `{path.stem}` | {run['document_tokens']}, {run['threads']} | {name} | "
                    f"{torch_row['time'] / row['time']:.2f} | {paired:.2f} "
                    f"| {row['peak'] / 2**20:.0f} | {load_average} |"
                )
    return lines if len(lines) > 3 else []


INT8_ROWS = {  # task: (the torch model's row, what it is); the int8 run names its rows after the graph's file
    "passkey": (("{m}", "one vector"), ("{m} late-chunk-max@256", "late-chunk-max")),
    "needle": (("{m}", "one vector"), ("{m} late-chunk-max@256", "late-chunk-max")),
    "context": (("{m} late chunks", "late chunks"), ("{m}", "one vector")),
}


def int8_block(root: Path) -> list[str]:
    """Each ``results/onnx/RUN`` (tools/evaluate_late_model.py MODEL RUN --onnx GRAPH): accuracy at 1 of the torch
    model (its results folder, named in RUN/source.json) and of the graph, task by task, on the same documents."""
    lines = []
    for run in sorted(p.parent for p in root.glob("*/source.json")):
        source = json.loads((run / "source.json").read_text())
        if not source.get("torch_results"):
            continue
        torch_root, graph = ROOT / source["torch_results"], Path(source["graph"]).stem
        cells, lengths, documents = {}, set(), set()
        for task, rows in INT8_ROWS.items():
            name = "context/context.json" if task == "context" else f"{task}/retrieval.json"
            torch_run, graph_run = (json.loads((r / name).read_text()) for r in (torch_root, run))
            if torch_run["settings"]["fingerprints"] != graph_run["settings"]["fingerprints"]:
                raise SystemExit(f"readme_embeddings: {run / name} has other documents than {torch_root / name}.")
            documents.add(graph_run["documents"])
            key = "rows" if task == "context" else "models"
            for row, label in rows:
                ours, theirs = torch_run[key][row.format(m="model")], graph_run[key][row.format(m=graph)]
                for length, a, b in zip(torch_run["lengths"], ours["accuracy"], theirs["accuracy"]):
                    cells[(task, label, length)] = f"{a:.2f} / {b:.2f}"
                    lengths.add(length)
        lengths = sorted(lengths)
        lines += [
            "| task | vectors | " + " | ".join(map(str, lengths)) + " |",
            "|---|---|" + "---|" * len(lengths),
            *(
                f"| {task} | {label} | " + " | ".join(cells.get((task, label, n), "-") for n in lengths) + " |"
                for task, rows in INT8_ROWS.items()
                for _, label in rows
            ),
            "",
            f"Accuracy at 1, torch / `{source['graph']}`, on the same documents "
            f"({' / '.join(map(str, sorted(documents)))} a length, task seed "
            f"{source.get('task_seed', 0)}), the torch figures from `{source['torch_results']}`, the graph's from "
            f"`{run.relative_to(ROOT)}`: `{source['command']}`.",
            "",
        ]
    return lines[:-1]


def kernels_block(root: Path) -> list[str]:
    """benchmarks/onnx_kernel_rates.py's JSON: each engine's time for one batch and its kernels' arithmetic rate."""
    lines = [
        "| run | engine | seconds | linear: s (GFLOP/s) | attention: s (GFLOP/s) | load |",
        "|---|---|---|---|---|---|",
    ]
    commands = []
    for path in sorted(root.glob("onnx-kernels-*.json")):
        run = json.loads(path.read_text())
        commands.append(run["command"])
        load = "{:.1f} / {:.1f}".format(run["load_average"]["before"][0], run["load_average"]["after"][0])
        for engine, row in run["engines"].items():
            linear, attention = row["kernels"]["linear"], row["kernels"]["attention"]
            lines.append(
                f"| `{path.stem}` | {engine} | {row['seconds']:.3f} | {linear['seconds']:.3f} ({linear['gflops']:.0f}) | "
                f"{attention['seconds']:.3f} ({attention['gflops']:.0f}) | {load} |"
            )
    return [*lines, "", "Commands: " + "; ".join(f"`{c}`" for c in commands) + "."] if commands else []


def gpu_block(root: Path) -> list[str]:
    """On a GPU (``results/gpu/``): the kernels' agreement with eager (benchmarks/gpu_kernels.py), then time and
    peak memory of a training step against stock (bench_methods' JSON)."""
    lines = []
    for path in sorted(root.glob("*kernels*.json")):
        run = json.loads(path.read_text())
        rows = [row for row in run["rows"] if "output_rel_diff" in row]
        failed = [f"{r['arch']} {r['method']} {r['backend']}" for r in run["rows"] if "error" in r]
        methods = sorted({r["method"] for r in rows})
        lines.append(
            f"- `{path.stem}` ({run['device']}, torch {run['torch']}, transformers {run['transformers']}, "
            f"{run['length']} tokens, batch 2): {', '.join(methods)} on {' and '.join(sorted({r['arch'] for r in rows}))}"
            f" through {' and '.join(sorted({r['backend'] for r in rows}))} differ from eager by at most "
            f"{max(r['output_rel_diff'] for r in rows):.1e} in the output and {max(r['grad_rel_diff_max'] for r in rows):.1e} "
            f"in any gradient (relative to the largest value); {'failed: ' + ', '.join(failed) if failed else 'none failed'}. "
            f"`{run['command']}`."
        )
    lines += [
        "",
        "| run | length | pass | variant | tokens/s | time vs stock | memory vs stock |",
        "|---|---|---|---|---|---|---|",
    ]
    runs = [(path, json.loads(path.read_text())) for path in sorted(root.glob("*.json")) if "kernels" not in path.stem]
    for path, run in runs:
        for row in run["rows"]:
            lines.append(
                f"| `{path.stem}` | {row['length']} | {row['pass']} | {row['variant']} | {row['tokens_per_s']:,.0f} | "
                f"{row['time_vs_stock_paired']:.2f} | {row['memory_vs_stock']:.2f} |"
            )
    return [*lines, "", "Each run's command: " + "; ".join(f"`{run['command']}`" for _, run in runs) + "."]


def chunking_block(root: Path, task: str) -> list[str]:
    """The stock model's chunk baselines beside the long models' one vector and their late chunks, then per length
    which wins: one vector, the stock model's best chunk, or the long model's best late chunk."""
    folders = [root / f.format(task=task) for f in CHUNKING]
    missing = [str(f) for f in folders if not (f / "retrieval.json").is_file()]
    if missing:
        raise SystemExit(f"readme_embeddings: no {task} results in {', '.join(missing)}; run the evaluation first.")
    results = merged(load(folders[0]), load(folders[1]))
    # The shipped recipe's runs (one column, its seeds' mean and spread), where they were scored on this task.
    recipe = sorted(
        p.name for p in root.glob(f"{RECIPE_RUN}*") if p.name == RECIPE_RUN or is_seed_of(p.name, RECIPE_RUN)
    )
    for folder in run_folders(root, recipe, task):
        if (folder / "retrieval.json").is_file() and load(folder)["task"] == task:
            results = merged(results, load(folder))
    results = seed_groups(results)
    chunk = sorted({n.rsplit("@", 1)[1] for n in results["models"] if "@" in n})  # the columns say the size
    sizes = f"`@{'`, `@'.join(chunk)}`: chunks of that many tokens, the stock model's limit; " if chunk else ""
    what = (
        "chunk-mean keeps one vector per document (the mean of its chunks'), chunk-max and late-chunk-max one per "
        "chunk (a document scores its best chunk)."
    )
    return [*table(results), "", caption(results, sizes + what), "", verdict_line(results)]


def caption(results: dict, more: str = "") -> str:
    """The line under a results table: metric, documents, chance, seed, what a column of seeds shows, and ``more``."""
    seeds = any(name.endswith(" seeds)") for name in results["models"])
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


def winners(results: dict) -> list[tuple[int, str, str]]:
    """Per length: (its index, the kind that scores most: "one vector", "chunks" or "late chunks", its column).
    Within one standard error of the best, the cheapest kind wins: one vector, then the stock model's chunks."""
    models, out = results["models"], []
    kinds = {
        "one vector": [n for n in models if "@" not in n],
        "chunks": [n for n in models if " chunk-max@" in n and "late-chunk" not in n],
        "late chunks": [n for n in models if "late-chunk-max@" in n],
    }
    for i in range(len(results["lengths"])):
        best = {kind: max(names, key=lambda n: models[n]["accuracy"][i]) for kind, names in kinds.items() if names}
        top = max(best.values(), key=lambda n: models[n]["accuracy"][i])
        floor = models[top]["accuracy"][i] - models[top]["stderr"][i]
        kind = next(k for k in best if models[best[k]]["accuracy"][i] >= floor)
        out.append((i, kind, best[kind]))
    return out


def verdict_line(results: dict) -> str:
    """One line: which way of keeping a long document finds it most often at each length."""
    models, lengths = results["models"], results["lengths"]
    parts = [f"{lengths[i]}: {kind} ({name}, {models[name]['accuracy'][i]:.2f})" for i, kind, name in winners(results)]
    return (
        f"Best per length ({results['task']}; within one standard error of the best, the fewest vectors): "
        + "; ".join(parts)
        + "."
    )


def verdict_block(root: Path) -> list[str]:
    """Both tasks' verdict lines, for the README."""
    return [f"- {chunking_block(root, task)[-1]}" for task in ("passkey", "needle")]


def demo_block(root: Path) -> list[str]:
    """The committed ``posswap demo`` run (``results/demo/``: its retrieval.json, context.json and demo.json): the
    table and the verdict it printed (``posswap.demo``'s own functions, from the figures), and what it took."""
    from posswap.demo import context_line, verdict
    from posswap.evaluation.context_retrieval import ContextResults
    from posswap.evaluation.retrieval import RetrievalResults

    results = load(root)
    run = json.loads((root / "demo.json").read_text())
    name = "trained" if run["steps"] else "patched"
    haystack = results["settings"].get("haystack", "filler")
    where = "LongEmbed's synthetic filler" if haystack == "filler" else f"held-out prose ({haystack.capitalize()})"
    context = [context_line(ContextResults.load(root), name)] if (root / "context.json").is_file() else []
    load_average = "/".join(f"{x:.2f}" for x in run["load_before"]) if run.get("load_before") else "not recorded"
    trained = f"{run['train_seconds']:.0f} s of it training" if run.get("train_seconds") else "no training"
    also = f", {run['context_documents']} of the context task" if run.get("context_documents") else ""
    return [
        *table(results),
        "",
        caption(results, f"The needle in {where}."),
        "",
        verdict(RetrievalResults.from_dict(results), name),
        *(["", *context] if context else []),
        "",
        f"`posswap demo` ({run['steps']} steps, {run['documents']} documents per length{also}): "
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
            lines += [*table(results), "", caption(results), "", verdict_line(results), ""]
    return [*lines, *filter(None, [training_line(root / "training.json")])]


def blocks(results: Path, speed: Path) -> dict[str, list[str]]:
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
        "passkey-summary": retrieval_block(results, "passkey", summary=True),
        "needle": retrieval_block(results, "needle"),
        "speed": speed_block(speed),
        **({"gpu": gpu_block(gpu)} if (gpu := results.parent / "gpu").is_dir() else {}),
        **({"demo": demo_block(results.parent / "demo")} if (results.parent / "demo" / "demo.json").is_file() else {}),
        **({"onnx-int8": int8_block(onnx)} if (onnx := results.parent / "onnx").is_dir() else {}),
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
            raise SystemExit(f"readme_embeddings: {path} has {start} but no {end}.")
        head, rest = text.split(start, 1)
        text = head + start + "\n" + "\n".join(lines) + "\n" + end + rest.split(end, 1)[1]
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="passkey", choices=("passkey", "needle"))
    parser.add_argument("--results", default=str(ROOT / "results" / "embeddings"))
    parser.add_argument(
        "--speed", default=str(ROOT / "results" / "speed"), help="bench_methods / bench_embeddings JSON"
    )
    parser.add_argument("--write", nargs="+", default=[], metavar="FILE", help="rewrite the generated blocks of FILE")
    parser.add_argument("--check", nargs="+", default=[], metavar="FILE", help="exit 1 when a block of FILE differs")
    args = parser.parse_args(argv)
    if not args.write and not args.check:
        print("\n".join(retrieval_block(Path(args.results), args.task)))
        return 0
    generated = blocks(Path(args.results), Path(args.speed))
    stale = []
    for path in args.write + args.check:
        text = Path(path).read_text()
        new = rewritten(text, generated, path)
        if path in args.write:
            Path(path).write_text(new)
        elif new != text:
            stale.append(path)
    for task in ("passkey", "needle") if args.write else ():  # the pictures the files show, drawn once
        plot_all(Path(args.results), task)
    if stale:
        print(f"readme_embeddings: stale generated blocks in {', '.join(stale)}; run --write.", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
