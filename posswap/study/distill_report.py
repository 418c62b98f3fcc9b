"""What the unpatched model as a teacher buys and costs in the text study: each variant that trained both without
it (``NAME``) and with it (``NAME-distill``), compared over the same held-out windows."""

from __future__ import annotations

from ..evaluation import Results
from ..evaluation.harness import paired_gap
from ..training.distill import DISTILLED
from .plan import DISTILL_WEIGHT, EXTEND
from .scoring import ORIGINAL, loss_metric, window_losses


def _gap(results: Results, a: str, b: str, length: int, metric: str) -> str:
    """``a`` minus ``b`` at ``length``, ± the paired standard error ("-" where either lacks the windows)."""
    windows = [window_losses(results, n, results.lengths.index(length), metric) for n in (a, b)]
    if None in windows:
        return "-"
    gap, se = paired_gap(*windows)
    return f"{gap:+.3f}" + (f" ± {se:.3f}" if se is not None else "")


def _minutes(seconds: dict, name: str) -> str:
    value = seconds.get(name)
    return "-" if value is None else f"{value / 60:.0f}"


def distill_lines(spec, results: Results, train_seconds: dict, causal: bool) -> list[str]:
    """A table of the pairs in ``results``: at 1x each against the original (the teacher: the target is a gap
    within its error), then the teacher's effect (with minus without) at every longer length, and the training
    minutes of both runs. Empty when no variant ran both ways."""
    metric = loss_metric(causal)
    pairs = [(n, n + DISTILLED) for n in results.models if n + DISTILLED in results.models]
    if not pairs or spec.length not in results.lengths:
        return []
    longer = [n for n in results.lengths if n > spec.length]
    header = [
        "variant",
        f"{spec.length} (1x): without − original",
        "with − original",
        *[f"{n} ({n // spec.length}x): with − without" for n in longer],
        "training minutes without / with",
    ]
    lines = [
        f"What the unpatched model as teacher (`train.distill`, weight {DISTILL_WEIGHT:g}, on each window's first "
        f"{spec.length} tokens) "
        f"buys: {metric} gaps ± paired standard error over the same windows (negative: lower loss). At {spec.length} "
        f"the teacher's own length, against the original; at {EXTEND}x and beyond, the run with the teacher against "
        "the one without. Training minutes include the held-out checks of the crossover curve (runs from different "
        "sessions may have shared the machine differently).",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join(["---"] * len(header)) + " |",
    ]
    for plain, taught in pairs:
        cells = [
            _gap(results, plain, ORIGINAL, spec.length, metric),
            _gap(results, taught, ORIGINAL, spec.length, metric),
            *[_gap(results, taught, plain, n, metric) for n in longer],
            f"{_minutes(train_seconds, plain)} / {_minutes(train_seconds, taught)}",
        ]
        lines.append("| " + " | ".join([f"`{plain}`", *cells]) + " |")
    return [*lines, ""]
