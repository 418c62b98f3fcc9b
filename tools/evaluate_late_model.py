"""The retrieval tasks of a late-chunking model, one after another, timed: what the README's context, needle
and passkey figures of a ``minilm-late-2k`` run come from, and the evaluation time the recipe is held to.

    python tools/evaluate_late_model.py out/minilm-late-2k-seed0/model results/context/minilm-late-2k-seed0

Writes ``OUT/context``, ``OUT/natural`` (the natural-reference task), ``OUT/needle`` and ``OUT/passkey`` (each
task's results) and ``OUT/eval_time.json``: each task's wall seconds, the threads, and the machine's load average
when it ended (a shared machine's time says so).
``--tasks context`` evaluates one task; its time goes to ``OUT/eval_time-context.json``. ``--seed 7`` builds the
tasks' documents from another seed (the default is each task's own, 0): the figures of a seed nothing was chosen on.
``--onnx GRAPH`` scores an export of MODEL (``posswap export MODEL --format onnx [--int8]``) instead: the same tasks
in this process, MODEL's tokenizer and pooling around the graph (:func:`posswap.onnx.backed.with_onnx_graph`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TASKS = {  # name: (posswap eval's --task, its --baselines)
    "context": ("context-retrieval", ()),
    "natural": ("natural-context-retrieval", ()),  # a real Persuasion passage under other names: only context decides
    "needle": ("needle-retrieval", ("chunk-max", "late-chunk-max")),
    "passkey": ("passkey-retrieval", ("chunk-max", "late-chunk-max")),
}
# The natural-reference task at the lengths the recipe trains, 60 passages in 2 copies (60 to 120 facts, each asked
# twice): a figure near chance (0.5) is good to about 0.05 to 0.07, where 40 documents left about 0.08 to 0.11.
NATURAL = {"lengths": [512, 1024, 2048], "documents": 120}


def task_flags(task: str) -> list[str]:
    cli_task, baselines = TASKS[task]
    flags = ["--task", cli_task, *(["--baselines", *baselines] if baselines else [])]
    if task == "natural":
        flags += ["--lengths", *map(str, NATURAL["lengths"]), "--documents", str(NATURAL["documents"])]
    return flags


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--stock", default="posswap:minilm", help="the stock model, first in every task")
    parser.add_argument("--seed", type=int, help="the tasks' seed (documents, facts, keys); default each task's own")
    parser.add_argument("--onnx", type=Path, help="score this exported graph of MODEL (e.g. OUT/onnx/model_qint8.onnx)")
    parser.add_argument(
        "--compare",
        type=Path,
        help="with --onnx: MODEL's own results folder (same tasks and seed), for the docs' table",
    )
    args = parser.parse_args(argv)
    if args.compare is not None and args.onnx is None:
        parser.error("--compare goes with --onnx (it names the torch results the graph's sit beside)")
    if args.onnx is not None and not args.onnx.is_file():
        parser.error(f"--onnx: no file at {args.onnx}; give the .onnx file posswap export wrote")
    seconds = run_in_process(args) if args.onnx else run_commands(args)
    record = {
        **seconds,
        "total_seconds": sum(seconds.values()),
        "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)),
        "load": Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else None,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    # A subset of the tasks is its own record: it never replaces the whole evaluation's time.
    name = "eval_time.json" if set(args.tasks) == set(TASKS) else f"eval_time-{'-'.join(args.tasks)}.json"
    (args.out / name).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


def run_commands(args) -> dict[str, int]:
    """Each task through ``posswap eval``, as a user runs it; the wall seconds of each."""
    seeded = [] if args.seed is None else ["--seed", str(args.seed)]
    seconds = {}
    for task in args.tasks:
        command = ["posswap", "eval", args.stock, args.model, *task_flags(task), *seeded, "--out", str(args.out / task)]
        print("$", " ".join(command), flush=True)
        start = time.monotonic()
        subprocess.run(command, check=True)
        seconds[f"{task}_seconds"] = round(time.monotonic() - start)
    return seconds


def run_in_process(args) -> dict[str, int]:
    """The tasks with ``posswap eval``'s settings, the model's transformer replaced by the graph ``args.onnx``."""
    from posswap.embeddings.context_retrieval import evaluate_context
    from posswap.embeddings.retrieval import evaluate_retrieval, load_embedding_model
    from posswap.onnx.backed import with_onnx_graph

    graph = with_onnx_graph(load_embedding_model(args.model, "cpu"), args.onnx)
    models = {args.stock.removeprefix("posswap:"): load_embedding_model(args.stock, "cpu"), args.onnx.stem: graph}
    seed = {} if args.seed is None else {"seed": args.seed}
    seconds = {}
    for task in args.tasks:
        print(f"# {task}: {args.stock} and {args.onnx}", flush=True)
        start = time.monotonic()
        if task in ("context", "natural"):
            sized = NATURAL if task == "natural" else {}
            results = evaluate_context(models, task=TASKS[task][0], **sized, **seed)
        else:
            results = evaluate_retrieval(models, task, baselines=list(TASKS[task][1]), **seed)
        results.save(args.out / task)
        seconds[f"{task}_seconds"] = round(time.monotonic() - start)
    source = {
        "graph": str(args.onnx),
        "model": args.model,
        "task_seed": args.seed or 0,
        "torch_results": str(args.compare) if args.compare else None,
        "command": " ".join(["python", *sys.argv]),
    }
    (args.out / "source.json").write_text(json.dumps(source, indent=1) + "\n")
    return seconds


if __name__ == "__main__":
    main()
