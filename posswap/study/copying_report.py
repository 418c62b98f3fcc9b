"""The copying study's summary and pictures, from its results JSON only (``copying.json``): the table of drops
(mean ± standard deviation over seeds), the probe against distance, the drop at 3x against steps, and the layer-0
attention by offset that shows whether the previous-token head survived the patch."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..evaluation.plots import plt, save_figure
from ..training.distill import DISTILLED
from .scoring import BASELINE, ORIGINAL


def mean_and_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (None for one value: no spread to measure)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


ATTENTION_PANELS = ("copy", "alibi", "rope")
NEAR = 1.5  # just past the old window: where a retrofit first has to read what the original never could  # a table method, a relative bias, RoPE: the three ways a retrofit goes


def seeds_at(runs: list[dict], index: int) -> list[list[float]]:
    """Per seed, the drops at every distance at checkpoint ``index`` of the curve (-1: after training)."""
    return [run["curve"][index]["drop"] for run in runs]


def cell(values: list[float]) -> str:
    mean, std = mean_and_std(values)
    return f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"


def first_step(runs: list[dict], at: int, level: float) -> int | None:
    """First checked step whose drop at distance ``at``, averaged over seeds, reaches ``level`` (None: never)."""
    for index, point in enumerate(runs[0]["curve"]):
        if sum(drops[at] for drops in seeds_at(runs, index)) / len(runs) >= level:
            return point["step"]
    return None


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def ranked_names(results: dict) -> list[str]:
    """Variants by their final drop at the target multiple, best first; the baseline last."""
    at = results["multiples"].index(results["target_multiple"])
    runs = results["runs"]
    score = {n: sum(d[at] for d in seeds_at(r, -1)) / len(r) for n, r in runs.items() if n != BASELINE}
    return sorted(score, key=lambda n: -score[n]) + ([BASELINE] if BASELINE in runs else [])


def copying_table(results: dict) -> list[str]:
    """One row per model: the drop at each distance after training, the drop at 3x right after the patch, and
    the first step at which the drop (mean over seeds) reaches ``min_copy`` at 1.5x and at 3x."""
    spec, multiples = results["spec"], results["multiples"]
    target, level, steps = results["target_multiple"], results["min_copy"], spec["steps"]
    at, near = multiples.index(target), multiples.index(NEAR)
    header = [
        "model",
        *[f"d = {m:g}x" for m in multiples],
        f"{target:g}x at step 0",
        f"first step ≥ {level:g} at {NEAR:g}x",
        f"first step ≥ {level:g} at {target:g}x",
    ]
    blank = [""] * 3
    lines = [
        _row(header),
        _row(["---"] * len(header)),
        _row([f"{ORIGINAL} (untrained)", *[f"{d:.2f}" for d in results["original"]["drop"]], *blank]),
    ]
    for name, untrained in results.get("untrained", {}).items():
        lines.append(_row([f"{name} (step 0)", *[f"{d:.2f}" for d in untrained["drop"]], *blank]))
    for name in ranked_names(results):
        runs = results["runs"][name]
        final = seeds_at(runs, -1)
        reached = [first_step(runs, i, level) for i in (near, at)]
        label = f"{name} ({steps} steps)" if name != BASELINE else f"{BASELINE} ({steps} steps at 1x)"
        lines.append(
            _row(
                [
                    label,
                    *[cell([seed[i] for seed in final]) for i in range(len(multiples))],
                    cell([seed[at] for seed in seeds_at(runs, 0)]),
                    *[f"not within {steps}" if r is None else r for r in reached],
                ]
            )
        )
    return lines


def distill_table(results: dict) -> list[str]:
    """What the teacher buys and costs, per recipe that ran with and without it: the drop inside the old window
    (what the teacher knows) and at the target multiple after training, mean ± std over seeds, and the training time
    with the teacher over the time without (means over seeds; runs share the machine, so the ratio is rough)."""
    runs, multiples, target = results["runs"], results["multiples"], results["target_multiple"]
    inside = max(m for m in multiples if m < 1)
    columns = [multiples.index(inside), multiples.index(target)]
    pairs = [
        (n.removesuffix(DISTILLED), n) for n in runs if n.endswith(DISTILLED) and n.removesuffix(DISTILLED) in runs
    ]
    if not pairs:
        return []
    header = ["recipe", *[f"{m:g}x {way}" for m in (inside, target) for way in ("without", "with")], "time ratio"]
    lines = [
        f"What distillation buys and costs: the drop at {inside:g}x (inside the old window, where the teacher reads) "
        f"and at {target:g}x after training, without and with the teacher; the training time with it over the time "
        "without (runs shared the machine: rough).",
        "",
        _row(header),
        _row(["---"] * len(header)),
    ]
    for plain, taught in pairs:
        final = {n: seeds_at(runs[n], -1) for n in (plain, taught)}
        cells = [cell([seed[i] for seed in final[n]]) for i in columns for n in (plain, taught)]
        seconds = [statistics.fmean(r["train_seconds"] for r in runs[n]) for n in (plain, taught)]
        lines.append(_row([plain, *cells, f"{seconds[1] / seconds[0]:.2f}x"]))
    return [*lines, ""]


def summary(results: dict) -> str:
    spec, copier = results["spec"], results["copier"]["recipe"]
    seeds = len(spec["seeds"])
    length = copier["length"]
    check = (results["copier"].get("check") or {}).get("drop")
    return "\n".join(
        [
            f"### Copying study: every method on the copier, {length} → {4 * length} positions",
            "",
            f"The copier: a {copier['n_layer']}-layer GPT-2 ({copier['n_embd']} wide, {length} learned positions, {copier['vocab']} random ids) "
            f"trained {copier['steps']} steps to copy"
            + (f"; its drop at 0.25/0.5/0.75x: {' / '.join(f'{d:.2f}' for d in check)} nats" if check else "")
            + ". "
            f"Each variant: patched (tables to {4 * length}, the rest to {8 * length}), trained {spec['steps']} steps of "
            f"{spec['batch_size']} x {4 * length} tiled random ids"
            + (
                f"; `{BASELINE}`: the same tokens at {length}, read with a sliding window. "
                if spec["baseline"]
                else ". "
            )
            + "The original reads past its window with a sliding window. "
            f"Probe: a span of {spec['span']} random ids, d random ids, the span again; the loss drop on the repeat in nats "
            f"(perfect copying: {math.log(copier['vocab']):.2f}), mean over {spec['spans']} spans"
            + (f", ± standard deviation over {seeds} seeds (training order and probe draws)." if seeds > 1 else "."),
            "",
            *copying_table(results),
            "",
            *distill_table(results),
        ]
    )


# --- pictures -------------------------------------------------------------------------------------------------


def _colours(names: list[str]):
    cmap = plt.get_cmap("tab20")  # its dark shades first (even indices), then the light ones: neighbours differ in hue
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return {name: cmap(order[i % 20]) for i, name in enumerate(names)}


def plot_probe(results: dict, path: Path) -> Path:
    """The drop against distance per model, right after the patch (left) and after training (right)."""
    names, multiples = ranked_names(results), results["multiples"]
    colours = _colours(names)
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for axis, index, title in (
        (axes[0], 0, "right after the patch"),
        (axes[1], -1, f"after {results['spec']['steps']} steps at 4x"),
    ):
        axis.plot(
            multiples,
            results["original"]["drop"],
            color="black",
            marker="s",
            linewidth=2,
            label=f"{ORIGINAL} (sliding window)",
        )
        for name in names:
            final = seeds_at(results["runs"][name], index)
            means = [sum(s[i] for s in final) / len(final) for i in range(len(multiples))]
            axis.plot(multiples, means, marker="o", color=colours[name], label=name)
        axis.axvline(1, color="grey", linestyle="--", linewidth=1)
        axis.axvline(4, color="grey", linestyle=":", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set_xticks(multiples, [f"{m:g}x" for m in multiples])
        axis.set_xlabel("distance d, x the old window (dashed: 1x; dotted: trained 4x)")
        axis.set_title(title, fontsize=9)
    axes[0].set_ylabel("loss drop on the repeat (nats)")
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.suptitle("Does the patched model read back past its old window? (copier, mean over seeds)", fontsize=10)
    return save_figure(figure, Path(path))


def plot_steps(results: dict, path: Path) -> Path:
    """The drop at the target multiple against training steps, mean over seeds with a band of ± one std."""
    names, at = ranked_names(results), results["multiples"].index(results["target_multiple"])
    colours = _colours(names)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name in names:
        runs = results["runs"][name]
        steps = [p["step"] for p in runs[0]["curve"]]
        stats = [mean_and_std([s[at] for s in seeds_at(runs, i)]) for i in range(len(steps))]
        means = [m for m, _ in stats]
        spread = [sd or 0.0 for _, sd in stats]
        axis.plot(steps, means, marker="o", markersize=3, color=colours[name], label=name)
        axis.fill_between(
            steps,
            [m - s for m, s in zip(means, spread)],
            [m + s for m, s in zip(means, spread)],
            color=colours[name],
            alpha=0.15,
        )
    axis.axhline(results["min_copy"], color="black", linestyle="--", linewidth=1, label=f"{results['min_copy']:g} nats")
    axis.set_xlabel("training steps at 4x")
    axis.set_ylabel(f"loss drop at d = {results['target_multiple']:g}x (nats)")
    axis.set_title(f"Copying from {results['target_multiple']:g}x the old window while training", fontsize=10)
    axis.legend(fontsize=7, ncol=2)
    return save_figure(figure, Path(path))


def previous_token_head(attention: list[list[float]]) -> int:
    """The layer-0 head of the original that puts most weight on the token just before."""
    return max(range(len(attention)), key=lambda h: attention[h][1])


def plot_attention(results: dict, path: Path) -> Path | None:
    """Layer 0's previous-token head (found in the original): its mean attention weight at each offset, in the
    original, right after each patch and after training. A head that keeps its spike at offset 1 still builds
    the previous-token circuit copying needs; one that lost it cannot copy."""
    panels = [n for n in ATTENTION_PANELS if n in results["runs"] and "layer0_attention" in results["runs"][n][0]]
    if not panels or "original_attention" not in results:
        return None
    head = previous_token_head(results["original_attention"])
    figure, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6), sharey=True, squeeze=False)
    for axis, name in zip(axes[0], panels):
        attention = results["runs"][name][0]["layer0_attention"]
        offsets = range(len(results["original_attention"][head]))
        axis.plot(
            offsets, results["original_attention"][head], color="black", marker="s", markersize=3, label="original"
        )
        axis.plot(offsets, attention["step 0"][head], marker="o", markersize=3, label="patched, step 0")
        axis.plot(
            offsets,
            attention["trained"][head],
            marker="o",
            markersize=3,
            label=f"after {results['spec']['steps']} steps",
        )
        axis.set_title(name, fontsize=10)
        axis.set_xlabel("offset i - j (tokens back)")
    axes[0][0].set_ylabel(f"layer 0, head {head}: mean attention weight")
    axes[0][-1].legend(fontsize=8)
    figure.suptitle(
        "Layer 0's previous-token head (the original's head with most weight one token back), before and after each patch",
        fontsize=10,
    )
    return save_figure(figure, Path(path))


def write_report(results: dict, out: Path) -> str:
    """summary.md and the three pictures in ``out``; returns the summary."""
    text = summary(results)
    (Path(out) / "summary.md").write_text(text)
    plot_probe(results, Path(out) / "probe.png")
    plot_steps(results, Path(out) / "probe_by_step.png")
    plot_attention(results, Path(out) / "attention_layer0.png")
    return text
