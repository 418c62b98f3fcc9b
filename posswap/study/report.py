"""The study's summary: markdown tables (README-ready) and the crossover plot, from the saved results only."""

from __future__ import annotations

import math
from pathlib import Path

from ..evaluation import Results
from ..evaluation.plots import plt, save_figure

NAMES = {"gpt2": "Reference GPT-2", "minilm": "MiniLM (all-MiniLM-L6-v2 + MLM head)"}


def crossover_step(curve: list, target: float) -> int | None:
    """First checked step whose held-out loss is below ``target`` (None: not within the budget)."""
    return next((step for step, loss in curve if loss < target), None)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def metric_table(spec, step0: Results, after: Results, metric: str) -> list[str]:
    """One row per model: ``step 0 -> after`` at each length."""
    lengths = step0.lengths
    lines = [_row(["model"] + [f"{n} ({n // spec.length}x)" for n in lengths]), _row(["---"] * (len(lengths) + 1))]
    for name in after.models:
        first = step0.models.get(name)
        last = after.models[name]
        cells = []
        for i in range(len(lengths)):
            now = _fmt(last.metrics[metric][i])
            if first is None or first == last:  # the originals are scored once: one value
                cells.append(now)
            else:
                cells.append(f"{_fmt(first.metrics[metric][i])} → {now}")
        lines.append(_row([name] + cells))
    return lines


def passkey_table(results: Results) -> list[str]:
    lines = [_row(["model"] + [str(n) for n in results.lengths]), _row(["---"] * (len(results.lengths) + 1))]
    for name, result in results.models.items():
        values = result.metrics.get("passkey")
        if values is not None:
            lines.append(_row([name] + [_fmt(v) for v in values]))
    return lines


def base_summary(spec, step0: Results, after: Results, curves: dict, causal: bool) -> str:
    metric = "ppl" if causal else "mlm_loss"
    steps = spec.budget.steps
    tokens = steps * spec.budget.batch_size * 4 * spec.length
    title = f"### {NAMES.get(spec.name, spec.name)}: {spec.length} → {4 * spec.length} positions"
    lines = [
        title, "",
        f"Held-out {'perplexity' if causal else 'MLM loss (nats)'} on *Persuasion* ({spec.eval_tokens:,} tokens per length), "
        f"untrained → after {steps} steps ({tokens:,} training tokens). `original` reads past its limit in pieces"
        + ("; `original (sliding)` and every variant past its own limit read with a sliding window." if causal else "; so does every variant past its own limit.")
        + (f" `original trained` is the original trained the same {steps} steps at {spec.length} tokens." if spec.baseline else ""),
        "",
        *metric_table(spec, step0, after, metric),
    ]
    if causal and any("passkey" in r.metrics for r in after.models.values()):
        lines += ["", f"Passkey accuracy after training ({spec.passkey_trials} keys × 5 depths per length):", "", *passkey_table(after)]
    target = curves["original_at_1x"]
    baseline = dict(tuple(p) for p in curves["curves"].get("original trained", []))
    lines += [
        "", f"Crossover: held-out {curves['metric']} at {curves['length']} tokens (4x) during training, against the "
        f"original at {spec.length} (1x) on the same tokens: {target:.4f}.", "",
        _row(["variant", "step 0"] + [f"step {s}" for s, _ in next(iter(curves["curves"].values()), [])]
             + ["first step below the original at 1x", "first step below `original trained` at 1x, same step"]),
    ]
    width = len(next(iter(curves["curves"].values()), [])) + 4
    lines.append(_row(["---"] * width))
    for name, curve in curves["curves"].items():
        start = curves["step0_at_4x"].get(name, target)
        found = 0 if start < target else crossover_step(curve, target)
        fair = next((step for step, loss in curve if step in baseline and loss < baseline[step]), None)
        fair_cell = "-" if name == "original trained" or not baseline else fair if fair is not None else f"not within {steps}"
        lines.append(_row([name, f"{start:.4f}"] + [f"{loss:.4f}" for _, loss in curve] + [found if found is not None else f"not within {steps}", fair_cell]))
    return "\n".join(lines)


def curve_plot(curves: dict, path: Path) -> Path:
    figure, axes = plt.subplots(figsize=(6, 4))
    for name, curve in curves["curves"].items():
        start = curves["step0_at_4x"].get(name, curves["original_at_1x"])
        points = [(0, start)] + [tuple(p) for p in curve]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    axes.axhline(curves["original_at_1x"], color="black", linestyle="--", linewidth=1, label="original at 1x")
    axes.set_xlabel("training steps")
    axes.set_ylabel(f"held-out {curves['metric']} (variants at 4x; 'original trained' at 1x)")
    axes.legend(fontsize=8)
    return save_figure(figure, Path(path))
