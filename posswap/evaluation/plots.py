"""PNG plots of a :class:`Results` and of position similarity (matplotlib, Agg: no display needed)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import torch  # noqa: E402

from ..portable.posswap_architectures import ARCHITECTURES  # noqa: E402
from ..portable.posswap_functional import (
    cosine_matrix,  # noqa: E402
    sinusoidal_table,  # noqa: E402
)
from .results import Results  # noqa: E402
from .similarity import head_dim, learned_table, rotary_similarity  # noqa: E402

MAX_SIMILARITY_POINTS = 512  # positions drawn per axis: a 4096 x 4096 image says nothing more


def slug(name: str) -> str:
    """A file-name part for a model's name; a name that had to change gets a short hash of itself, so two names
    ("a b" and "a_b", "modèle" and "mod_le") never write the same file."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"
    return safe if safe == name else f"{safe}-{hashlib.sha1(name.encode()).hexdigest()[:6]}"


def save_figure(figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_metric_vs_length(results: Results, metric: str, path: Path) -> Path | None:
    """One line per model that has ``metric``; None when no model has it."""
    figure, axes = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, result in results.models.items():
        values = result.metrics.get(metric)
        if values is None:
            continue
        points = [(length, v) for length, v in zip(results.lengths, values) if v is not None]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        limit = result.limit
        if limit is not None and results.lengths[0] <= limit <= results.lengths[-1]:
            axes.axvline(limit, color=axes.lines[-1].get_color(), linestyle=":", linewidth=1)
        drawn = True
    if not drawn:
        plt.close(figure)
        return None
    axes.set_xscale("log", base=2)
    axes.set_xlabel("context length (tokens); dotted: the model's own limit")
    axes.set_ylabel(metric)
    if metric == "ppl":
        axes.set_yscale("log")
    axes.legend(fontsize=8)
    return save_figure(figure, path)


def plot_per_position(results: Results, path: Path) -> Path | None:
    """Loss by position bucket at the longest length each model was scored at (one line per model)."""
    figure, axes = plt.subplots(figsize=(6, 4))
    drawn = False
    for name, result in results.models.items():
        measured = [(length, p) for length, p in zip(results.lengths, result.per_position) if p]
        if not measured:
            continue
        length, buckets = measured[-1]
        centres = [(a + b) / 2 for a, b in zip(buckets["edges"][:-1], buckets["edges"][1:])]
        points = [(c, v) for c, v in zip(centres, buckets["loss"]) if v is not None]
        axes.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=f"{name} @ {length}")
        drawn = True
    if not drawn:
        plt.close(figure)
        return None
    axes.set_xlabel("position in the window")
    axes.set_ylabel("loss")
    axes.legend(fontsize=8)
    return save_figure(figure, path)


def plot_passkey(results: Results, name: str, path: Path) -> Path | None:
    passkey = results.models[name].passkey
    if not passkey:
        return None
    accuracy = torch.tensor([[float("nan") if v is None else v for v in row] for row in passkey["accuracy"]])
    figure, axes = plt.subplots(figsize=(6, 4))
    image = axes.imshow(accuracy.t().numpy(), vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="lower")
    axes.set_xticks(range(len(results.lengths)), [str(length) for length in results.lengths])
    axes.set_yticks(range(len(passkey["depths"])), [f"{d:.2f}" for d in passkey["depths"]])
    axes.set_xlabel("length (tokens)")
    axes.set_ylabel("depth of the key")
    axes.set_title(f"passkey accuracy: {name} ({passkey['trials']} trials)")
    figure.colorbar(image)
    return save_figure(figure, path)


def plot_similarity(model, name: str, path: Path) -> Path:
    """Cosine similarity of position pairs: the model's table (if it still has one), the sinusoidal table of
    the same size, and rotary embedding with the model's head size."""
    table = learned_table(model)
    positions = len(table) if table is not None else model.config.max_position_embeddings
    step = max(1, positions // MAX_SIMILARITY_POINTS)
    index = torch.arange(0, positions, step)
    panels = []
    if table is not None:
        panels.append((f"{name}: learned table", cosine_matrix(table[index])))
    panels.append(("sinusoidal", cosine_matrix(sinusoidal_table(positions, model.config.hidden_size)[index])))
    panels.append(
        (f"rotary (head dim {head_dim(model)})", rotary_similarity(positions, head_dim(model))[index][:, index])
    )
    figure, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), layout="constrained")
    extent = (0, positions, positions, 0)
    for axis, (title, matrix) in zip(axes, panels):
        image = axis.imshow(matrix.numpy(), vmin=-1, vmax=1, cmap="RdBu_r", extent=extent)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("position j")
        axis.set_ylabel("position i")
    figure.colorbar(image, ax=list(axes), shrink=0.8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def write_plots(results: Results, out: Path, models: dict | None = None) -> list[Path]:
    """Every plot the results (and, for similarity maps, the live models) allow; returns the files."""
    out = Path(out)
    written = [
        plot_metric_vs_length(results, "ppl", out / "ppl_vs_length.png"),
        plot_metric_vs_length(results, "mlm_loss", out / "mlm_loss_vs_length.png"),
        plot_per_position(results, out / "per_position_loss.png"),
    ]
    for name in results.models:
        written.append(plot_passkey(results, name, out / f"passkey_{slug(name)}.png"))
    for name, model in (models or {}).items():
        if getattr(model.config, "model_type", None) in ARCHITECTURES:  # a table to find, a head size to read
            written.append(plot_similarity(model, name, out / f"similarity_{slug(name)}.png"))
    return [path for path in written if path is not None]


def plot_repeat(probes: dict[str, dict], original_length: int, path: Path) -> Path:
    """The repeat probe (:func:`posswap.evaluation.repeat.repeat_probe`) of each model: the loss drop on the
    repeated span, with its standard error, against the filler length as a multiple of ``original_length``
    (the window the models were trained with); past 1x only a model that reads beyond it can copy."""
    figure, axes = plt.subplots(figsize=(6, 4))
    for name, probe in probes.items():
        x = [d / original_length for d in probe["distances"]]
        error = [0.0 if se is None else se for se in probe["drop_se"]]
        axes.errorbar(x, probe["drop"], yerr=error, marker="o", capsize=3, label=f"{name} ({probe['kind']})")
    axes.axvline(1.0, color="grey", linestyle="--", linewidth=1, label="original window")
    axes.axhline(0.0, color="black", linewidth=0.5)
    axes.set_xlabel(f"filler d between the two occurrences (multiples of {original_length} tokens)")
    axes.set_ylabel("loss drop on the repeated span (nats)")
    title = "Repeated text at a distance: loss on the first occurrence minus loss on the repeat"
    axes.set_title(f"{title}\n(masked LMs: copy hidden minus copy visible)", fontsize=9)
    axes.legend(fontsize=8)
    return save_figure(figure, Path(path))
