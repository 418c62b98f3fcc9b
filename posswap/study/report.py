"""The study's summary: markdown tables (README-ready, every number with its standard error) and the crossover
and probe plots, from the saved results only."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ..evaluation import Results
from ..evaluation.harness import paired_gap
from ..evaluation.plots import plt, save_figure
from .distill_report import distill_lines
from .plan import EXTEND, plain_variant
from .scoring import BASELINE, ORIGINAL, OTHER_MASKS, SLIDING, load_sets, loss_metric, window_losses

NAMES = {"gpt2": "Reference GPT-2", "minilm": "MiniLM (all-MiniLM-L6-v2 + MLM head)"}
SETS = {
    "posswap:austen-heldout": "*Persuasion* (fiction, same author as training)",
    "posswap:technical-heldout": "the Python tutorial and HOWTOs (technical prose, unseen domain)",
}


def crossover_step(curve: list, target: float) -> int | None:
    """First checked step whose held-out loss is below ``target`` (None: not within the budget)."""
    return next((step for step, loss in curve if loss < target), None)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def with_error(value: float | None, error: float | None, digits: int = 2) -> str:
    """``value ± error`` (``value`` alone when the error is unknown)."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    if error is None:
        return f"{value:.{digits}f}"
    return f"{value:.{digits}f} ± {error:.{digits}f}"


def scored_cell(result, i: int, causal: bool) -> str:
    """Perplexity (causal; its error is ppl x the loss's) or MLM loss, with the standard error over windows."""
    if causal:
        ppl, se = result.metrics["ppl"][i], (result.metrics.get("loss_se") or [None] * (i + 1))[i]
        return with_error(ppl, ppl * se if se is not None and not math.isinf(ppl) else None, 1 if ppl >= 100 else 2)
    se = (result.metrics.get("mlm_loss_se") or [None] * (i + 1))[i]
    return with_error(result.metrics["mlm_loss"][i], se, 3)


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def untrained_result(step0: Results | None, name: str):
    """``name``'s step-0 scores: a NAME-distill variant is NAME until it trains (None where not scored)."""
    if step0 is None:
        return None
    own = step0.models.get(name)
    return own if own is not None else step0.models.get(plain_variant(name))


def metric_table(spec, step0: Results | None, after: Results, causal: bool) -> list[str]:
    """One row per model: its untrained numbers (at 1x and 4x), then after training at every length."""
    lengths = after.lengths
    early = step0.lengths if step0 is not None else []
    header = (
        ["model"] + [f"step 0, {n // spec.length}x" for n in early] + [f"{n} ({n // spec.length}x)" for n in lengths]
    )
    lines = [_row(header), _row(["---"] * len(header))]
    for name, result in after.models.items():
        first = untrained_result(step0, name)
        untrained = [
            scored_cell(first, i, causal) if first is not None and first is not result else ""
            for i in range(len(early))
        ]
        if first is not None and name in (ORIGINAL, SLIDING, OTHER_MASKS):
            untrained = ["(same)"] * len(early)
        lines.append(_row([name] + untrained + [scored_cell(result, i, causal) for i in range(len(lengths))]))
    return lines


def ranking(results: Results, length: int, causal: bool, names) -> str | None:
    """The models ``names`` at ``length``, best first, each with its loss gap to the best ± the paired standard
    error (the same windows for every model): a gap under about two of those is not a difference."""
    metric, i = loss_metric(causal), results.lengths.index(length)
    windows = {n: window_losses(results, n, i, metric) for n in names}
    windows = {n: w for n, w in windows.items() if w is not None}
    if len(windows) < 2:
        return None
    order = sorted(windows, key=lambda n: results.models[n].metrics[metric][i])
    best = order[0]
    gaps = [f"`{best}` {results.models[best].metrics[metric][i]:.3f}"]
    for name in order[1:]:
        gap, se = paired_gap(windows[name], windows[best])
        gaps.append(f"`{name}` +{gap:.3f}" + (f" ± {se:.3f}" if se is not None else ""))
    return f"Ranked by {metric} at {length} tokens, gap to the best ± paired standard error: " + "; ".join(gaps) + "."


def cross_length_gap(long: list[float], short: list[float]) -> tuple[float, float | None]:
    """Loss of a model read in long windows minus one read in short windows of the same text, ± the paired
    standard error: the short windows tile the long ones, so each group of them is averaged to pair with one."""
    if not long or len(short) % len(long):
        raise ValueError(f"{len(short)} short windows do not tile {len(long)} long ones.")
    k = len(short) // len(long)
    return paired_gap(long, [sum(short[i * k : (i + 1) * k]) / k for i in range(len(long))])


def against_baseline_at_1x(spec, results: Results, causal: bool) -> str | None:
    """Every model at 4x against ``original trained`` at 1x, paired over the text: the question the long phase
    asks (does reading 4x after training beat the original trained the same steps at its own length?)."""
    metric, long_length = loss_metric(causal), EXTEND * spec.length
    if not {spec.length, long_length} <= set(results.lengths):
        return None
    reference = window_losses(results, BASELINE, results.lengths.index(spec.length), metric)
    read_long = {
        n: window_losses(results, n, results.lengths.index(long_length), metric) for n in [*spec.variants, BASELINE]
    }
    gaps = [
        (n, *cross_length_gap(w, reference)) for n, w in read_long.items() if w is not None and reference is not None
    ]
    if not gaps:
        return None
    text = (
        "the same text"
        if causal
        else "nearly the same text with other masked tokens (each window's [CLS] and [SEP] shift it)"
    )
    return (
        f"At {long_length} tokens against `{BASELINE}` at {spec.length}, {metric} gap ± paired standard error over "
        f"{text}, its short windows averaged in groups: "
        + "; ".join(f"`{n}` {gap:+.3f}" + (f" ± {se:.3f}" if se is not None else "") for n, gap, se in gaps)
        + "."
    )


def probe_table(probe: dict) -> list[str]:
    """Loss drop on the repeated span (reference minus repeat), ± its standard error over spans, per distance."""
    multiples = probe["multiples"]
    lines = [_row(["model"] + [f"d = {m:g}x" for m in multiples]), _row(["---"] * (len(multiples) + 1))]
    for name, found in probe["models"].items():
        lines.append(_row([name] + [with_error(v, e, 2) for v, e in zip(found["drop"], found["drop_se"])]))
    return lines


MIN_COPY_DROP = 0.1  # nats: a model that copies gains several on a repeated span; a few hundredths is not copying


def probe_check(probe: dict, reader: str = ORIGINAL) -> str | None:
    """The probe means something only if the original reads a repeat back inside its own window: a drop of at least
    ``MIN_COPY_DROP`` and more than two standard errors at some d < 1x. Otherwise a warning line, so no one reads
    the table as evidence."""
    found = probe["models"].get(reader)
    inside = [i for i, m in enumerate(probe["multiples"]) if m < 1]
    if found is None or not inside:
        return None
    drops = [(found["drop"][i], found["drop_se"][i]) for i in inside]
    if any(se is not None and drop >= MIN_COPY_DROP and drop > 2 * se for drop, se in drops):
        return None
    shown = ", ".join(
        f"{with_error(found['drop'][i], found['drop_se'][i], 2)} at {probe['multiples'][i]:g}x" for i in inside
    )
    return (
        f"**The probe does not work on this model:** `{reader}` shows no drop of {MIN_COPY_DROP} nats and two standard errors "
        f"inside its own window ({shown}), so it does not read a repeat back even where it can see it, and this table cannot tell the "
        "methods apart."
    )


def _probe_text(probe: dict, causal: bool) -> str:
    what = (
        "loss on the first occurrence minus loss on the second"
        if causal
        else "MLM loss of span tokens masked in the second occurrence with the first masked too, minus with the first visible"
    )
    return (
        f"Repeat probe on *Persuasion*: a held-out span of {probe['span']} tokens, filler of d tokens, the span again; "
        f"{what} (nats, ± standard error over {probe['models'][next(iter(probe['models']))]['n'][0]} spans). "
        "Large = the model reads the copy d tokens back. The original reads past its limit "
        + ("with a sliding window." if causal else "in pieces.")
    )


def base_summary(spec, step0: dict | None, after: dict, curves: dict, probe: dict | None, causal: bool) -> str:
    steps, lr = spec.budget.steps, spec.budget.lr
    tokens = steps * spec.budget.batch_size * 4 * spec.length
    lines = [
        f"### {NAMES.get(spec.name, spec.name)}: {spec.length} → {4 * spec.length} positions, {spec.phase} budget "
        f"({steps} steps at lr {lr:g}, {tokens:,} training tokens per variant"
        + (f"; {spec.repeat_fraction:.0%} of the windows with a repeated span" if spec.repeat_fraction else "")
        + ")",
        "",
    ]
    for data, results in after.items():
        lines += [
            f"Held-out {'perplexity' if causal else 'MLM loss (nats)'} on {SETS.get(data, data)}, {spec.eval_tokens:,} tokens per "
            "length, ± the standard error over windows. `step 0`: untrained, right after the patch. `original` reads past its "
            "limit in pieces"
            + (
                "; `original (sliding)` and every variant past its own limit read with a sliding window."
                if causal
                else "; so does every variant past its own limit."
            )
            + (
                f" `original trained`: the original trained the same {steps} steps at {spec.length} tokens."
                if spec.baseline
                else ""
            )
            + (
                ""
                if causal
                else " `original, mask seed 1`: the original with other masked tokens, the noise floor of this table."
            ),
            "",
            *metric_table(spec, (step0 or {}).get(data), results, causal),
            "",
        ]
        ranked = [ranking(results, n, causal, [*spec.variants, SLIDING, BASELINE]) for n in results.lengths[1:]]
        ranked.append(against_baseline_at_1x(spec, results, causal))
        lines += [f"- {line}" for line in ranked if line] + ([""] if any(ranked) else [])
        lines += distill_lines(spec, results, curves.get("train_seconds", {}), causal)
    if probe is not None:
        warning = probe_check(probe)
        lines += [_probe_text(probe, causal), "", *probe_table(probe), "", *([warning, ""] if warning else [])]
    lines += crossover_lines(spec, curves, step0)
    return "\n".join(lines)


STEPS_PER_TABLE = 6  # a curve table's step columns: more are split over further tables, each fits a phone


def crossover_lines(spec, curves: dict, step0: dict | None) -> list[str]:
    """The crossover: when each variant first beats the original, then its curve, a few steps a table."""
    target, steps = curves["original_at_1x"], curves["steps"]
    baseline = dict(tuple(p) for p in curves["curves"].get("original trained", []))
    first_set = (step0 or {}).get(spec.heldout_data)
    at = (
        first_set.lengths.index(curves["length"])
        if first_set is not None and curves["length"] in first_set.lengths
        else None
    )
    firsts = [
        _row(
            ["variant", "first step below the original at 1x", "first step below `original trained` at 1x, same step"]
        ),
        _row(["---"] * 3),
    ]
    points = {}  # variant -> [step 0, each checked step's loss]
    for name, curve in curves["curves"].items():
        untrained = untrained_result(first_set, name) if at is not None else None
        start = untrained.metrics[curves["metric"]][at] if untrained is not None else None
        found = 0 if start is not None and start < target else crossover_step(curve, target)
        fair = next((step for step, loss in curve if step in baseline and loss < baseline[step]), None)
        fair_cell = (
            "-" if name == "original trained" or not baseline else fair if fair is not None else f"not within {steps}"
        )
        firsts.append(_row([name, found if found is not None else f"not within {steps}", fair_cell]))
        points[name] = [_fmt(start)] + [f"{loss:.4f}" for _, loss in curve]
    intro = (
        f"Crossover: held-out {curves['metric']} at {curves['length']} tokens (4x) during training, against the "
        f"original at {spec.length} (1x) on the same tokens: {target:.4f}."
    )
    return [intro, "", *firsts, *curve_tables(next(iter(curves["curves"].values()), []), points)]


def curve_tables(checked: list, points: dict[str, list[str]]) -> list[str]:
    """Each variant's loss at step 0 and at every checked step, ``STEPS_PER_TABLE`` steps a table."""
    headers = ["step 0"] + [f"step {s}" for s, _ in checked]
    lines = []
    for first in range(0, len(headers), STEPS_PER_TABLE):
        part = slice(first, first + STEPS_PER_TABLE)
        lines += ["", _row(["variant", *headers[part]]), _row(["---"] * (len(headers[part]) + 1))]
        lines += [_row([name, *cells[part]]) for name, cells in points.items()]
    return lines


def curve_plot(curves: dict, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(6, 4))
    for name, curve in curves["curves"].items():
        points = [tuple(p) for p in curve]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    axes.axhline(curves["original_at_1x"], color="black", linestyle="--", linewidth=1, label="original at 1x")
    axes.set_xlabel("training steps")
    axes.set_ylabel(f"held-out {curves['metric']}")
    axes.set_title("Variants read 4x, 'original trained' reads 1x; dashed: the untrained original at 1x", fontsize=8)
    axes.legend(fontsize=7)
    return save_figure(figure, Path(path))


def probe_plot(probe: dict, path: Path) -> Path:
    from ..evaluation.plots import plot_repeat

    return plot_repeat(probe["models"], probe["length"], Path(path))


def saved_summary(spec, results_root: Path) -> tuple[str, dict, dict | None]:
    """:func:`base_summary` of ``spec``'s phase from the files its run saved under ``results_root`` (its own step-0
    scores; a long phase saved before it scored its own, the quick phase's), with the crossover curves and the probe
    (None without one) it read."""
    folder = Path(results_root) / spec.name / spec.phase
    own, quick = folder / "step0", Path(results_root) / spec.name / "quick" / "step0"
    first = own if own.is_dir() else quick
    step0 = load_sets(spec, first) if first.is_dir() else None
    curves = json.loads((folder / "curves.json").read_text())
    probe = json.loads((folder / "probe.json").read_text()) if (folder / "probe.json").is_file() else None
    text = base_summary(spec, step0, load_sets(spec, folder / "trained"), curves, probe, causal=spec.name == "gpt2")
    return text, curves, probe
