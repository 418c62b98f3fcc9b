"""The speed tables of the embeddings and ONNX pages, from the benchmarks' JSON (nothing typed by hand): time and
peak memory against stock (``benchmarks/bench_methods.py``, ``benchmarks/bench_embeddings.py``), the exported graph
against the torch model (``tools/evaluate_late_model.py``, ``benchmarks/onnx_kernel_rates.py``) and a GPU's
(``results/gpu/``). Written with the other generated blocks by ``python -m posswap.cli.generate --write``."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ..files import shown_command

ROOT = Path(__file__).resolve().parents[2]  # the clone: results/ and the pages live there


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


GRAPH_ROWS = {  # task: (the torch model's row, what it is); the graph's run names its rows after the graph's file
    "passkey": (("{m}", "one vector"), ("{m} late-chunk-max@256", "late-chunk-max")),
    "needle": (("{m}", "one vector"), ("{m} late-chunk-max@256", "late-chunk-max")),
    "context": (("{m} late chunks", "late chunks"), ("{m}", "one vector")),
}


def graph_block(root: Path) -> list[str]:
    """Each ``ROOT/RUN`` (tools/evaluate_late_model.py MODEL RUN --onnx GRAPH; results/onnx: int8 graphs,
    results/onnx-bias: a bias method's graph): accuracy at 1 of the torch model (its results folder, named in
    RUN/source.json) and of the graph, task by task (those the run scored), on the same documents."""
    lines = []
    for run in sorted(p.parent for p in root.glob("*/source.json")):
        source = json.loads((run / "source.json").read_text())
        if not source.get("torch_results"):
            continue
        torch_root, graph = ROOT / source["torch_results"], Path(source["graph"]).stem
        cells, lengths, documents, tasks = {}, set(), set(), []
        for task, rows in GRAPH_ROWS.items():
            name = "context/context.json" if task == "context" else f"{task}/retrieval.json"
            if not (run / name).is_file():  # a run of some of the tasks (--tasks)
                continue
            tasks.append(task)
            torch_run, graph_run = (json.loads((r / name).read_text()) for r in (torch_root, run))
            if torch_run["settings"]["fingerprints"] != graph_run["settings"]["fingerprints"]:
                raise SystemExit(f"report: {run / name} has other documents than {torch_root / name}.")
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
                for task in tasks
                for _, label in GRAPH_ROWS[task]
            ),
            "",
            f"Accuracy at 1, torch / `{source['graph']}`, on the same documents "
            f"({' / '.join(map(str, sorted(documents)))} a length, task seed "
            f"{source.get('task_seed', 0)}), the torch figures from `{source['torch_results']}`, the graph's from "
            f"`{run.relative_to(ROOT)}`: `{shown_command(source['command'])}`.",
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
            f"`{shown_command(run['command'])}`."
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
    return [
        *lines,
        "",
        "Each run's command: " + "; ".join(f"`{shown_command(run['command'])}`" for _, run in runs) + ".",
    ]


def bias_memory_block(root: Path) -> list[str]:
    """benchmarks/onnx_bias_memory.py's JSON: peak memory and time of one call, each bias method's graph and torch
    model against the graph without a bias, at each length; the graph file's size. Columns kept few: a phone."""
    lines = []
    for path in sorted(root.glob("memory-*.json")):
        run = json.loads(path.read_text())
        load = "{:.1f} / {:.1f}".format(run["load_average"]["before"][0], run["load_average"]["after"][0])
        calls = {(c["method"], c["length"], c["engine"]): c for c in run["calls"]}
        lines += [
            "| method | tokens | peak MiB: graph / torch | seconds: graph / torch | file MiB |",
            "|---|---|---|---|---|",
        ]
        for method, length in dict.fromkeys((m, n) for m, n, _ in calls):
            graph, torch_ = calls[(method, length, "onnx")], calls[(method, length, "torch")]
            lines.append(
                f"| {method} | {length} | {graph['peak_bytes'] / 2**20:.0f} / {torch_['peak_bytes'] / 2**20:.0f} | "
                f"{graph['seconds']:.2f} / {torch_['seconds']:.2f} | {graph['graph_bytes'] / 2**20:.0f} |"
            )
        lines += ["", f"`{path.relative_to(ROOT)}`, load average {load}: `{shown_command(run['command'])}`.", ""]
    return lines[:-1]
