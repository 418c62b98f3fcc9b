"""Print (or write) the contextual chunk retrieval tables from the results JSON (nothing typed by hand):

    python tools/readme_context.py                                        # print the blocks
    python tools/readme_context.py --write README.md docs/late-chunking.md  # rewrite their generated blocks
    python tools/readme_context.py --check README.md docs/late-chunking.md  # exit 1 when a block differs

Reads ``results/context/<run>/context/context.json`` (``posswap eval posswap:minilm STRIDE RUN --task
context-retrieval``) and ``<run>/needle`` and ``<run>/passkey`` (``--baselines chunk-max late-chunk-max``) for
each run folder. A block sits between ``<!-- posswap:context-NAME -->`` and ``<!-- /posswap:context-NAME -->``:
``summary`` (per length: the stock model's chunks, the untrained patch's late chunks (from ``untrained.json`` where
the run did not score them), the recipe's late chunks and one vector; then the verdict), ``parity`` (late chunks
against the stock chunks on passkey and needle), ``placement`` (the shipped run against the changes tried: the runs
of ``history/`` with a ``changes.diff``). The summary adds a line for each ``task-seed-N/RUN`` (``posswap eval ...
--seed N``: a task seed nothing was chosen on).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "context"


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def runs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if (p / "context" / "context.json").is_file())


def recipe_late_row(context: dict) -> str:
    """The context.json row of the recipe's late chunks: the last model's (the stock model and the untrained patch
    come first)."""
    return [r for r in context["rows"] if r.endswith(" late chunks")][-1]


def cell(value: float, error: float) -> str:
    return f"{value:.2f} ± {error:.2f}"


def with_untrained(context: dict, root: Path) -> dict:
    """The run's context.json with the untrained patch's rows from ``root/untrained.json`` where the run did not
    score them (the same documents: their fingerprints must agree)."""
    if len([r for r in context["rows"] if r.endswith(" late chunks")]) > 1:
        return context
    untrained = load(root / "untrained.json")
    if untrained["settings"]["fingerprints"] != context["settings"]["fingerprints"]:
        raise SystemExit(f"{root / 'untrained.json'} scored other documents than the run: rescore the untrained patch.")
    first, *rest = context["rows"].items()  # the stock chunks, then the untrained rows ahead of the run's
    return context | {"rows": dict([first]) | untrained["rows"] | dict(rest)}


def columns(context: dict) -> dict[str, str]:
    """What each row of a context.json is: stock chunks, untrained late chunks, the recipe's late chunks, and the
    recipe's one vector (the last model of the run)."""
    rows = list(context["rows"])
    chunks = next(r for r in rows if r.endswith(" chunks") and not r.endswith("late chunks"))
    late = [r for r in rows if r.endswith(" late chunks")]
    vectors = [r for r in rows if r not in late and r != chunks and not r.startswith("stride-untrained")]
    return {"stock chunks": chunks, "late (untrained)": late[0], "late (recipe)": late[-1], "one vector": vectors[-1]}


def summary_block(run: Path) -> list[str]:
    context = with_untrained(load(run / "context" / "context.json"), run.parent)
    named = columns(context)
    heads = [f"{name}: all chunks" for name in named] + [f"{name}: facts" for name in list(named)[:3]]
    lines = [f"| tokens | {' | '.join(heads)} |", "|---|" + "---|" * len(heads)]
    for i, length in enumerate(context["lengths"]):
        rows = [context["rows"][row] for row in named.values()]
        cells = [cell(r["accuracy"][i], r["stderr"][i]) for r in rows]
        cells += [cell(r["fact_accuracy"][i], r["fact_stderr"][i]) for r in rows[:3]]
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Context retrieval ({run.name}; {context['documents']} documents a length, two questions each, chunks of at "
        f"most {context['chunk_tokens']} tokens, seed {context['seed']}): accuracy at 1 ± standard error; *all "
        "chunks*: the fact's chunk first among every chunk of every document; *facts*: among the chunks that answer "
        f"the same question (chance {context['settings']['chance']['fact_accuracy'][0]:.2f}).",
        "",
        verdict(context, named),
    ]
    return lines


def verdict(context: dict, named: dict[str, str]) -> str:
    """Which row puts the fact's chunk first most often at each length (ties within one standard error: all)."""
    parts = []
    for i, length in enumerate(context["lengths"]):
        scores = {name: context["rows"][row]["accuracy"][i] for name, row in named.items()}
        best = max(scores, key=scores.get)
        error = context["rows"][named[best]]["stderr"][i]
        near = [n for n in scores if scores[best] - scores[n] <= error]
        parts.append(f"{length}: {' = '.join(near)} ({scores[best]:.2f})")
    return "Best per length (context, all chunks): " + "; ".join(parts) + "."


def retrieval_columns(models: dict) -> tuple[str, str, str]:
    """A retrieval.json's stock chunk-max column, the recipe's late-chunk-max column and its one-vector column."""
    stock = next(name for name in models if " chunk-max@" in name and " late-" not in name)
    late = [name for name in models if " late-chunk-max@" in name][-1]
    return stock, late, late.split(" late-chunk-max@")[0]


def stock_chunk_tokens(models: dict) -> str:
    """The stock chunks' size, from the column's name ("minilm chunk-max@256")."""
    return retrieval_columns(models)[0].split("@")[-1]


def parity_block(run: Path, seeds: list[Path]) -> list[str]:
    """Per task and length: the stock model's chunk-max, the recipe's late-chunk-max and its one vector (``run``),
    then late-chunk-max minus the stock chunk-max and the one vector of every trained seed (``seeds``)."""
    lines = [
        "| task | tokens | stock chunk-max | late-chunk-max | one vector | late - stock, each seed | one vector, each seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in ("passkey", "needle"):
        path = run / task / "retrieval.json"
        if not path.is_file():
            continue
        data = load(path)
        models = data["models"]
        each = [load(r / task / "retrieval.json")["models"] for r in seeds]
        shown = retrieval_columns(models)
        for i, length in enumerate(data["lengths"]):
            cells = [cell(models[n]["accuracy"][i], models[n]["stderr"][i]) for n in shown]
            gaps, vectors = [], []
            for seed in each:
                stock, late, vector = retrieval_columns(seed)
                gaps.append(f"{seed[late]['accuracy'][i] - seed[stock]['accuracy'][i]:+.2f}")
                vectors.append(f"{seed[vector]['accuracy'][i]:.2f}")
            lines.append(
                f"| {task} | {length} | " + " | ".join(cells) + f" | {' / '.join(gaps)} | {' / '.join(vectors)} |"
            )
    lines += [
        "",
        f"{run.name}: accuracy at 1 ± standard error, {data['documents']} documents per length; chunks of the stock "
        f"model's {stock_chunk_tokens(data['models'])} tokens (late-chunk-max pools the same spans in the whole "
        "document). Each seed: " + ", ".join(r.name for r in seeds) + ".",
    ]
    return lines


def untouched_parity_lines(root: Path) -> list[str]:
    """Per ``task-seed-N/RUN`` scored on passkey and needle: late - stock chunks and the one vector per length."""
    lines = []
    for run in untouched_runs(root):
        parts = []
        for task in ("passkey", "needle"):
            path = run / task / "retrieval.json"
            if not path.is_file():
                continue
            data = load(path)
            stock, late, vector = retrieval_columns(data["models"])
            m = data["models"]
            cells = [
                f"{n}: {m[late]['accuracy'][i] - m[stock]['accuracy'][i]:+.2f} / {m[vector]['accuracy'][i]:.2f}"
                for i, n in enumerate(data["lengths"])
            ]
            parts.append(f"{task} " + "; ".join(cells))
        if parts:
            seed = load(run / "context" / "context.json")["seed"]
            lines += [
                "",
                f"On task seed {seed}, {run.name} (late - stock chunks / one vector): " + "; ".join(parts) + ".",
            ]
    return lines


def seeds_line(found: list[Path]) -> str:
    """The recipe's late chunks (all chunks, accuracy at 1) over every run folder of it: mean ± sd per length."""
    import statistics

    per_length: dict[int, list[float]] = {}
    for run in found:
        context = load(run / "context" / "context.json")
        row = recipe_late_row(context)
        for length, value in zip(context["lengths"], context["rows"][row]["accuracy"]):
            per_length.setdefault(length, []).append(value)
    cells = [
        f"{n}: {statistics.mean(v):.2f} ± {statistics.stdev(v):.2f} ({len(v)} seeds)"
        if len(v) > 1
        else f"{n}: {v[0]:.2f} (1 seed)"
        for n, v in sorted(per_length.items())
    ]
    return "The recipe's late chunks over its trained seeds (mean ± sd, all chunks): " + "; ".join(cells) + "."


def untouched_runs(root: Path) -> list[Path]:
    """The recipe's runs on task seeds nothing was chosen on: ``task-seed-N/RUN``."""
    return [r for folder in sorted(root.glob("task-seed-*")) for r in runs(folder)]


def untouched_lines(root: Path) -> list[str]:
    """The recipe's late chunks on task seeds nothing was chosen on (``task-seed-N/RUN``), one line each."""
    lines = []
    for run in untouched_runs(root):
        context = load(run / "context" / "context.json")
        row = context["rows"][recipe_late_row(context)]
        cells = [f"{n}: {cell(a, e)}" for n, a, e in zip(context["lengths"], row["accuracy"], row["stderr"])]
        lines += [
            "",
            f"On task seed {context['seed']} (documents, subjects and facts no choice was made on), {run.name}'s "
            f"late chunks (all chunks): " + "; ".join(cells) + ".",
        ]
    return lines


def placement_block(seeds: list[Path], tried: list[Path]) -> list[str]:
    """The shipped recipe's runs (each seed) against the changes tried in ``history/`` (the runs with a
    ``changes.diff``): late chunks on the context task per length, needle and passkey at the two longest lengths."""
    shown = seeds + tried
    contexts = [load(r / "context" / "context.json") for r in shown]
    lengths = contexts[0]["lengths"]
    heads = [f"context {n}" for n in lengths] + ["needle: late - stock chunks", "passkey: one vector"]
    lines = [f"| run | {' | '.join(heads)} |", "|---|" + "---|" * len(heads)]
    for r, context in zip(shown, contexts):
        cells = [f"{v:.2f}" for v in context["rows"][recipe_late_row(context)]["accuracy"]]
        for task in ("needle", "passkey"):
            path = r / task / "retrieval.json"
            if not path.is_file():
                cells.append("-")
                continue
            models = load(path)["models"]
            stock, late_max, vector = retrieval_columns(models)
            if task == "needle":
                pairs = zip(models[late_max]["accuracy"][-2:], models[stock]["accuracy"][-2:])
                cells.append(" / ".join(f"{a - b:+.2f}" for a, b in pairs))
            else:
                cells.append(" / ".join(f"{a:.2f}" for a in models[vector]["accuracy"][-2:]))
        lines.append(f"| {r.name} | " + " | ".join(cells) + " |")
    first = load(seeds[0] / "needle" / "retrieval.json")
    lines += [
        "",
        f"Late chunks, accuracy at 1 among all chunks (context, task seed {contexts[0]['seed']}, "
        f"{contexts[0]['documents']} documents a length); needle: the late chunks' best chunk minus the stock model's "
        f"{stock_chunk_tokens(first['models'])}-token chunks, and passkey: one vector, at "
        f"{' / '.join(map(str, first['lengths'][-2:]))} tokens.",
    ]
    return lines


def blocks(root: Path) -> dict[str, list[str]]:
    found = runs(root)
    complete = [r for r in found if (r / "passkey" / "retrieval.json").is_file()]
    if not complete:
        raise SystemExit(f"No complete results in {root}: run posswap eval ... --task context-retrieval first.")
    run = complete[0]  # the first seed scored on every task; the others add their late chunks to seeds_line
    history = runs(root / "history") if (root / "history").is_dir() else []
    tried = [r for r in history if (r / "changes.diff").is_file()]  # a change to the recipe or placement, tried
    return {
        "summary": summary_block(run) + ["", seeds_line(found)] + untouched_lines(root),
        "parity": parity_block(run, complete) + untouched_parity_lines(root),
        "placement": placement_block(complete, tried),
    }


def rewritten(text: str, generated: dict[str, list[str]]) -> str:
    for name, lines in generated.items():
        pattern = re.compile(rf"(<!-- posswap:context-{name} -->\n).*?(<!-- /posswap:context-{name} -->)", re.S)
        body = "\n".join(lines) + "\n"
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--write", nargs="*", default=None)
    parser.add_argument("--check", nargs="*", default=None)
    args = parser.parse_args(argv)
    generated = blocks(args.results)
    for path in args.write or []:
        Path(path).write_text(rewritten(Path(path).read_text(), generated))
    stale = [p for p in args.check or [] if rewritten(Path(p).read_text(), generated) != Path(p).read_text()]
    for path in stale:
        print(f"{path}: a context block differs from the results; run tools/readme_context.py --write {path}")
    if args.write is None and args.check is None:
        for name, lines in generated.items():
            print(f"<!-- posswap:context-{name} -->\n" + "\n".join(lines) + f"\n<!-- /posswap:context-{name} -->\n")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
