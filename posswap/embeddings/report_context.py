"""The contextual chunk retrieval tables of the README and docs/late-chunking.md from the results JSON (nothing
typed by hand), written with every generated block by ``python -m posswap.cli.generate --write``.

Reads ``results/context/<run>/context/context.json`` (``posswap eval posswap:minilm STRIDE RUN --task
context-retrieval``) and ``<run>/needle`` and ``<run>/passkey`` (``--baselines chunk-max late-chunk-max``) for
each run folder. A block sits between ``<!-- posswap:context-NAME -->`` and ``<!-- /posswap:context-NAME -->``:
``summary`` (per length: the stock model's chunks, the untrained patch's late chunks (from ``untrained.json`` where
the run did not score them), the recipe's late chunks and one vector; then the verdict, the seeds and the task seeds
nothing was chosen on), ``front`` (the summary's table and verdict alone, for the README), ``parity`` (late chunks
against the stock chunks on passkey and needle, the recipe's seeds as mean ± sd), ``placement`` (the shipped runs
against the changes tried: the runs of ``history/`` with a ``changes.diff`` and the rows of the runs pruned from it,
:mod:`.history`).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from .context_retrieval import accuracy_by_haystack, fact_by_template
from .history import SUMMARY, load, placement_row, recipe_late_row, retrieval_columns, runs
from .verdicts import pick

ROOT = Path(__file__).resolve().parents[2]  # the clone: results/ and the pages live there
RESULTS = ROOT / "results" / "context"


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
    """Which row puts the fact's chunk first most often at each length: the cheapest within one standard error of
    the best (:func:`posswap.embeddings.verdicts.pick`; one vector, then the chunks, the recipe's late chunks last)."""
    order = ["one vector", *(name for name in named if name != "one vector")]
    rows = context["rows"]
    ways = {name: [(named[name], rows[named[name]]["accuracy"], rows[named[name]]["stderr"])] for name in order}
    picks = pick(context["lengths"], ways)
    return (
        "Best per length (context, all chunks; within one standard error of the best, the fewest vectors): "
        + "; ".join(p.text(column=False) for p in picks)
        + "."
    )


def stock_chunk_tokens(models: dict) -> str:
    """The stock chunks' size, from the column's name ("minilm chunk-max@256")."""
    return retrieval_columns(models)[0].split("@")[-1]


def seed_cell(values: list[float]) -> str:
    """The recipe's seeds at one length: mean ± standard deviation (one seed: its value)."""
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def parity_rows(task: str, seeds: list[Path]) -> list[str]:
    """A row per length of ``task``: the stock chunk-max (the same stock model on every seed's documents), the
    recipe's late-chunk-max and one vector over its seeds, then late - stock and the one vector of each seed."""
    each = [load(r / task / "retrieval.json") for r in seeds if (r / task / "retrieval.json").is_file()]
    if not each:
        return []
    rows = []
    for i, length in enumerate(each[0]["lengths"]):
        stock, late, vector = (
            [s["models"][c]["accuracy"][i] for s in each] for c in retrieval_columns(each[0]["models"])
        )
        first = each[0]["models"][retrieval_columns(each[0]["models"])[0]]
        gaps = " / ".join(f"{a - b:+.2f}" for a, b in zip(late, stock))
        cells = [cell(first["accuracy"][i], first["stderr"][i]), seed_cell(late), seed_cell(vector)]
        rows.append(
            f"| {task} | {length} | " + " | ".join(cells) + f" | {gaps} | {' / '.join(f'{v:.2f}' for v in vector)} |"
        )
    return rows


def parity_block(run: Path, seeds: list[Path]) -> list[str]:
    """Per task and length: the stock model's chunk-max, the recipe's late-chunk-max and its one vector over its
    seeds (mean ± sd: the figures the README's verdict reads), then each seed's late - stock and one vector."""
    n = len(seeds)
    lines = [
        f"| task | tokens | stock chunk-max | late-chunk-max ({n} seeds) | one vector ({n} seeds) | late - stock, each "
        "seed | one vector, each seed |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in ("passkey", "needle"):
        lines += parity_rows(task, seeds)
    data = load(run / "passkey" / "retrieval.json")
    lines += [
        "",
        f"Accuracy at 1, {data['documents']} documents per length; the stock chunk-max ± its standard error, the "
        f"recipe's columns mean ± standard deviation over its {n} seeds; chunks of the stock model's "
        f"{stock_chunk_tokens(data['models'])} tokens (late-chunk-max pools the same spans in the whole document). "
        "Each seed: " + ", ".join(r.name for r in seeds) + ".",
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


def placement_cells(row: dict) -> list[str]:
    cells = [f"{v:.2f}" for v in row["context"]]
    needle, passkey = row["needle_late_minus_stock"], row["passkey_one_vector"]
    cells.append(" / ".join(f"{v:+.2f}" for v in needle[-2:]) if needle else "-")
    cells.append(" / ".join(f"{v:.2f}" for v in passkey[-2:]) if passkey else "-")
    return cells


def placement_block(seeds: list[Path], tried: list[Path], pruned: list[dict]) -> list[str]:
    """The shipped recipe's runs (each seed) against the changes tried in ``history/`` (the runs with a
    ``changes.diff``) and those pruned from it (their rows in the history summary): late chunks on the context task
    per length, needle and passkey at the two longest lengths."""
    contexts = [load(r / "context" / "context.json") for r in seeds]
    lengths = contexts[0]["lengths"]
    heads = [f"context {n}" for n in lengths] + ["needle: late - stock chunks", "passkey: one vector"]
    lines = [f"| run | {' | '.join(heads)} |", "|---|" + "---|" * len(heads)]
    for row in [placement_row(r) for r in seeds + tried] + [r for r in pruned if r.get("changes")]:
        lines.append(f"| {row['run']} | " + " | ".join(placement_cells(row)) + " |")
    first = load(seeds[0] / "needle" / "retrieval.json")
    lines += [
        "",
        f"Late chunks, accuracy at 1 among all chunks (context, task seed {contexts[0]['seed']}, "
        f"{contexts[0]['documents']} documents a length); needle: the late chunks' best chunk minus the stock model's "
        f"{stock_chunk_tokens(first['models'])}-token chunks, and passkey: one vector, at "
        f"{' / '.join(map(str, first['lengths'][-2:]))} tokens. The runs pruned from `results/context/history/` "
        f"(at most its last ten are kept) are rows of `results/context/{SUMMARY}`.",
    ]
    return lines


def tried_runs(root: Path) -> list[Path]:
    """The run folders of ``root/history`` (none where it has no history)."""
    return runs(root / "history") if (root / "history").is_dir() else []


def natural_files(root: Path) -> list[tuple[str, Path]]:
    """(run, context.json) of the natural-reference task: the baselines' folders (``natural-reference/RUN``,
    scored with the stock model and the untrained patch) first, then each run's ``RUN/natural``: the recipe's seeds,
    then the changes tried (``history/RUN``)."""
    baselines = sorted((p.name, p / "context.json") for p in (root / "natural-reference").glob("*/"))
    scored = [(r.name, r / "natural" / "context.json") for r in runs(root) + tried_runs(root)]
    return [(name, path) for name, path in baselines + scored if path.is_file()]


def natural_block(root: Path) -> list[str]:
    """Late chunks on the natural-reference task, fact accuracy (the fact's chunk of the right copy above the other
    copy's; chance one in two) per length: the stock chunks, the untrained patch, each run's late chunks. Every file
    must hold the same documents (their fingerprints agree)."""
    found = [(name, load(path)) for name, path in natural_files(root)]
    if not found:
        return []
    first = found[0][1]
    rows: dict[str, dict] = {}
    for name, context in found:
        if context["settings"]["fingerprints"] != first["settings"]["fingerprints"]:
            raise SystemExit(
                f"{name}'s natural-reference results scored other documents than {found[0][0]}'s: rescore."
            )
        late = [r for r in context["rows"] if r.endswith(" late chunks")]
        if not rows:
            named = columns(context)
            rows["the stock model's chunks"] = context["rows"][named["stock chunks"]]
            rows["the untrained patch's late chunks"] = context["rows"][late[0]]
        rows[f"{name}'s late chunks"] = context["rows"][late[-1]]
    lines = [f"| vectors | {' | '.join(f'{n} tokens' for n in first['lengths'])} |"]
    lines.append("|---|" + "---|" * len(first["lengths"]))
    for label, row in rows.items():
        cells = [cell(a, e) for a, e in zip(row["fact_accuracy"], row["fact_stderr"])]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    chance = first["settings"]["chance"]["fact_accuracy"][0]
    lines += [
        "",
        f"Natural-reference retrieval ({first['settings']['made']}; seed {first['seed']}, chunks of at most "
        f"{first['chunk_tokens']} tokens): the fact's chunk of the right copy ranked above the other copy's, ± "
        f"standard error (chance {chance:.2f}). By whom the passage names last before the fact chunk, the subject "
        "/ the other person of the pair (a chunk that takes on its nearest name scores high, then low):",
        "",
        lines[0],
        lines[1],
    ]
    for label, row in list(rows.items())[1:]:
        cells = [nearest_cell(first, row, i) for i in range(len(first["lengths"]))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def transfer_lines(root: Path) -> list[str]:
    """Per run with ``shift-2048.json`` (``tools/context_diagnosis.py MODEL --length 2048 --shift --out``): its late
    chunks' fact-chunk share on the recipe's templates against the evaluation's, the first line and the last."""
    lines = []
    for run in runs(root) + tried_runs(root):
        path = run / "shift-2048.json"
        if not path.is_file():
            continue
        record = load(path)
        ends = record["lines"][0], record["lines"][-1]
        shares = [line["first_hits"].get("the fact's chunk", 0.0) for line in ends]
        texts = record.get("recipe_haystacks")  # recorded since the tool reads the run's own; before: the novels
        lines.append(
            f"Transfer at {record['length']} tokens ({run.name}; `tools/context_diagnosis.py --shift`, "
            f"{record['documents']} documents of task seed {record['task_seed']}): the fact's chunk first "
            f"{shares[0]:.2f} on {ends[0]['label']}, {shares[1]:.2f} on {ends[1]['label']}"
            + (f" (the recipe's cut from {', '.join(dict.fromkeys(texts))})." if texts else " (the recipe's novels).")
        )
    return lines


def haystack_block(root: Path, length: int = 2048) -> list[str]:
    """Per recipe seed and per run of the history: its late chunks' accuracy at 1 (all chunks) on the context task
    at ``length`` tokens, per haystack (half of the documents each)."""
    rows, names, seed = [], [], None
    for run in runs(root) + [r for r in tried_runs(root) if (r / "context" / "context.json").is_file()]:
        context = load(run / "context" / "context.json")
        if length not in context["lengths"]:
            continue
        late = recipe_late_row(context)
        shares = accuracy_by_haystack(
            context["rows"][late]["hits"][context["lengths"].index(length)], context["settings"]
        )
        names, seed = list(shares), context["seed"]
        rows.append(f"| {run.name} | " + " | ".join(f"{shares[n]:.2f}" for n in names) + " |")
    if not rows:
        return []
    return [
        f"| run | {' | '.join(names)} |",
        "|---|" + "---|" * len(names),
        *rows,
        "",
        f"Late chunks at {length} tokens, accuracy at 1 among all chunks, per haystack (half of the documents each; "
        f"context task seed {seed}).",
    ]


def nearest_cell(context: dict, row: dict, i: int) -> str:
    """The row's fact accuracy at length ``i`` on the facts whose nearest preceding name is the subject, then on
    those where it is the other person of the pair (each query's template)."""
    shares = fact_by_template(row["fact_hits"][i], context["settings"]["queries"][str(context["lengths"][i])])
    return " / ".join(f"{shares[t][0]:.2f}" if t in shares else "-" for t in ("nearest-subject", "nearest-other"))


def blocks(root: Path = RESULTS) -> dict[str, list[str]]:
    """Every ``context-NAME`` block, by NAME."""
    found = runs(root)
    complete = [r for r in found if (r / "passkey" / "retrieval.json").is_file()]
    if not complete:
        raise SystemExit(f"No complete results in {root}: run posswap eval ... --task context-retrieval first.")
    run = complete[0]  # the first seed scored on every task; the others add their late chunks to seeds_line
    history = tried_runs(root)
    tried = [r for r in history if (r / "changes.diff").is_file()]  # a change to the recipe or placement, tried
    summary = root / SUMMARY
    pruned = json.loads(summary.read_text())["rows"] if summary.is_file() else []
    front = summary_block(run)
    return {
        "summary": front + ["", seeds_line(found)] + untouched_lines(root),
        "front": front,
        "parity": parity_block(run, complete) + untouched_parity_lines(root),
        "placement": placement_block(complete, tried, pruned),
        "natural": natural_block(root) + [line for t in transfer_lines(root) for line in ("", t)],
        "haystacks": haystack_block(root),
    }


def rewritten(text: str, generated: dict[str, list[str]]) -> str:
    """``text`` with each ``context-NAME`` block it holds written from ``generated``."""
    for name, lines in generated.items():
        pattern = re.compile(rf"(<!-- posswap:context-{name} -->\n).*?(<!-- /posswap:context-{name} -->)", re.S)
        body = "\n".join(lines) + "\n"
        text = pattern.sub(lambda m, body=body: m.group(1) + body + m.group(2), text)
    return text
