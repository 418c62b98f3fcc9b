"""The three retrieval tasks of a late-chunking model, one after another, timed: what the README's context, needle
and passkey figures of a ``minilm-late-2k`` run come from, and the evaluation time the recipe is held to.

    python tools/evaluate_late_model.py out/minilm-late-2k-seed0/model results/context/minilm-late-2k-seed0

Writes ``OUT/context``, ``OUT/needle`` and ``OUT/passkey`` (each task's results) and ``OUT/eval_time.json``: each
task's wall seconds, the threads, and the machine's load average when it ended (a shared machine's time says so).
``--tasks context`` evaluates one task; its time goes to ``OUT/eval_time-context.json``. ``--seed 7`` builds the
tasks' documents from another seed (the default is each task's own, 0): the figures of a seed nothing was chosen on.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TASKS = {
    "context": ["--task", "context-retrieval"],
    "needle": ["--task", "needle-retrieval", "--baselines", "chunk-max", "late-chunk-max"],
    "passkey": ["--task", "passkey-retrieval", "--baselines", "chunk-max", "late-chunk-max"],
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out", type=Path)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--stock", default="posswap:minilm", help="the stock model, first in every task")
    parser.add_argument("--seed", type=int, help="the tasks' seed (documents, facts, keys); default each task's own")
    args = parser.parse_args(argv)
    seeded = [] if args.seed is None else ["--seed", str(args.seed)]
    seconds = {}
    for task in args.tasks:
        command = ["posswap", "eval", args.stock, args.model, *TASKS[task], *seeded, "--out", str(args.out / task)]
        print("$", " ".join(command), flush=True)
        start = time.monotonic()
        subprocess.run(command, check=True)
        seconds[f"{task}_seconds"] = round(time.monotonic() - start)
    record = {
        **seconds,
        "total_seconds": sum(seconds.values()),
        "threads": int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)),
        "load": Path("/proc/loadavg").read_text().strip() if Path("/proc/loadavg").exists() else None,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    # A subset of the tasks is its own record: it never replaces the three tasks' time.
    name = "eval_time.json" if set(args.tasks) == set(TASKS) else f"eval_time-{'-'.join(args.tasks)}.json"
    (args.out / name).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
