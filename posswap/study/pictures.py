"""Pictures for the extension study, for any model posswap patched (and the stock one):

- :func:`position_similarity` / :func:`plot_position_maps`: a heat map of each model's position representation
  (its table's cosine similarity, RoPE's rotation similarity, or the first layer's positional logit term);
- :func:`attention_by_distance` / :func:`plot_attention_by_distance`: mean attention weight against query-key
  distance, per layer, from the model's own attention weights on real text;
- :func:`t5_bias_by_distance` / :func:`plot_t5_buckets`: a t5-bias model's learned bias per head against distance.

Which method a model runs is read from its config's ``posswap`` block (none: the stock learned table); what to
draw of it is the method's registered ``position_map``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ..evaluation.plots import MAX_SIMILARITY_POINTS, plt, save_figure
from ..evaluation.similarity import learned_table
from ..patching import CONFIG_KEY
from ..portable.posswap_architectures import Sites, find_sites
from ..portable.posswap_attention import BIAS_IMPLEMENTATIONS
from ..portable.posswap_functional import cosine_matrix
from ..portable.posswap_t5 import T5Buckets, t5_buckets
from ..portable.posswap_tupe import TupeBias
from ..registry import get_method

LEARNED = "learned"  # what method_of says of a stock model
Map = tuple[torch.Tensor, str]  # (matrix over the chosen positions, description)
MAP_COLOURS = plt.get_cmap("RdBu_r").with_extremes(bad="0.8")  # grey: keys a causal mask hides (NaN)


def method_of(model: nn.Module) -> str:
    """The posswap method the model runs; ``"learned"`` for a stock model."""
    block = getattr(model.config, CONFIG_KEY, None)
    return block["method"] if block else LEARNED


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def learned_map(model: nn.Module, sites: Sites, positions: torch.Tensor) -> Map:
    """A stock model's map: its learned table's rows, the cosine of each pair."""
    return cosine_matrix(learned_table(model)[positions]), "learned table: cosine of rows"


def position_map(model: nn.Module) -> Callable[[nn.Module, Sites, torch.Tensor], Map | None]:
    """The map function of the method the model runs (its registration's ``position_map``)."""
    method = method_of(model)
    return learned_map if method == LEARNED else get_method(method).position_map


def position_similarity(model: nn.Module, length: int, step: int = 1) -> Map | None:
    """The map of the model's position representation over positions 0, step, 2 step, ... below ``length``:
    a float32 CPU matrix (len(positions), len(positions)) and a one-line description of what it shows; None
    for NoPE. Cosine similarities for tables and RoPE, logit terms for ALiBi, T5 and TUPE (NaN where a causal
    mask hides the key)."""
    sites = find_sites(model)
    if not 0 < length <= sites.max_length:
        raise ValueError(f"length must be in 1..{sites.max_length} (the positions this model reads); got {length}.")
    positions = torch.arange(0, length, step)
    with torch.no_grad():
        result = position_map(model)(model, sites, positions)
    return None if result is None else (result[0].float(), result[1])


def _grid(count: int, columns: int = 3):
    columns = min(columns, count)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.4 * columns, 4.0 * rows), squeeze=False)
    for axis in axes.flat[count:]:
        axis.axis("off")
    return figure, list(axes.flat)


def plot_position_maps(models: dict[str, nn.Module], length: int, path: Path) -> Path:
    """One heat map per model (at most ``length`` positions each, fewer where a model reads fewer), its
    description as the panel title; NoPE gets a panel saying "no positions"."""
    figure, axes = _grid(len(models))
    for axis, (name, model) in zip(axes, models.items()):
        shown = min(length, find_sites(model).max_length)
        result = position_similarity(model, shown, step=max(1, shown // MAX_SIMILARITY_POINTS))
        if result is None:
            axis.text(0.5, 0.5, "no positions", ha="center", va="center", transform=axis.transAxes)
            axis.set_title(name, fontsize=9)
            axis.axis("off")
            continue
        matrix, description = result
        limit = float(matrix.nan_to_num().abs().max()) or 1.0  # centred colours: 0 is white for every kind
        image = axis.imshow(matrix.numpy(), vmin=-limit, vmax=limit, cmap=MAP_COLOURS, extent=(0, shown, shown, 0))
        axis.set_title(f"{name}\n{description}", fontsize=8)
        axis.set_xlabel("position j (key)")
        axis.set_ylabel("position i (query)")
        figure.colorbar(image, ax=axis, shrink=0.8)
    return save_figure(figure, Path(path))


# --- attention against distance ---------------------------------------------------------------------------------


def eager_kernel(implementation: str) -> str:
    """The kernel that returns attention weights in the family of ``implementation`` (the bias family keeps its
    bias; every other kernel, RoPE's included, becomes transformers' eager)."""
    return BIAS_IMPLEMENTATIONS["eager"] if implementation in BIAS_IMPLEMENTATIONS.values() else "eager"


def weight_by_distance(weights: torch.Tensor, causal: bool, max_distance: int) -> torch.Tensor:
    """(max_distance + 1,) mean attention weight of the (head, query, key) entries at each distance i - j
    (|i - j| for encoders; a decoder's masked keys, j > i, are left out); NaN at distances that do not occur.
    ``weights`` is (heads, q, k) for one sequence without a cache."""
    q, k = weights.shape[-2:]
    distance = torch.arange(q, device=weights.device)[:, None] - torch.arange(k, device=weights.device)[None, :]
    distance = distance if causal else distance.abs()
    keep = (distance >= 0) & (distance <= max_distance)
    sums = torch.zeros(max_distance + 1, device=weights.device, dtype=torch.float64)
    sums.index_add_(0, distance[keep], weights.double().mean(0)[keep])
    counts = torch.bincount(distance[keep], minlength=max_distance + 1)
    return (sums / counts).float().cpu()


class _RecordByDistance:
    """Forward hook on one self-attention module: reduces its attention weights at once (never all layers'
    (heads, n, n) weights held together)."""

    def __init__(self, causal: bool, max_distance: int, per_head: bool = False):
        self.causal, self.max_distance, self.per_head, self.curve = causal, max_distance, per_head, None

    def __call__(self, module: nn.Module, inputs: tuple, output: tuple) -> None:
        weights = output[1]
        if weights is None:
            raise RuntimeError(f"{type(module).__name__} returned no attention weights under the eager kernel.")
        if self.per_head:
            self.curve = torch.stack(
                [weight_by_distance(head[None], self.causal, self.max_distance) for head in weights[0]]
            )
        else:
            self.curve = weight_by_distance(weights[0], self.causal, self.max_distance)


def attention_by_distance(
    model: nn.Module, input_ids: torch.Tensor, max_distance: int | None = None, per_head: bool = False
) -> torch.Tensor:
    """(layers, max_distance + 1) float32: per layer, the mean attention weight at each query-key distance
    (i - j for decoders, |i - j| for encoders; default up to len(input_ids) - 1), over heads and queries, from one
    forward pass over ``input_ids`` (1-D); ``per_head``: (layers, heads, max_distance + 1), each head apart. Runs in eval mode under the eager kernel of the model's own family,
    so the weights are the ones the model computes; kernel and train/eval mode are put back afterwards."""
    if input_ids.dim() != 1:
        raise ValueError(f"input_ids must be 1-D (one sequence); got shape {tuple(input_ids.shape)}.")
    max_distance = len(input_ids) - 1 if max_distance is None else max_distance
    sites = find_sites(model)
    recorders = [_RecordByDistance(sites.arch.causal, max_distance, per_head) for _ in sites.self_attentions()]
    handles = [a.register_forward_hook(r) for a, r in zip(sites.self_attentions(), recorders)]
    kernel, training = model.config._attn_implementation, model.training
    try:
        model.set_attn_implementation(eager_kernel(kernel))
        model.eval()
        with torch.no_grad():
            model(input_ids=input_ids[None].to(_device(model)))
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(kernel)
        model.train(training)
    return torch.stack([r.curve for r in recorders])


def _layer_panels(layer: str | int) -> list[tuple[str, Callable[[torch.Tensor], torch.Tensor]]]:
    panels = {
        "mean": ("mean over layers", lambda c: c.mean(0)),
        "last": ("last layer", lambda c: c[-1]),
    }
    if layer == "both":
        return [panels["mean"], panels["last"]]
    if isinstance(layer, int):
        return [(f"layer {layer}", lambda c: c[layer])]
    if layer not in panels:
        raise ValueError(f"layer must be 'mean', 'last', 'both' or a layer index; got {layer!r}.")
    return [panels[layer]]


def plot_attention_by_distance(curves: dict[str, torch.Tensor], path: Path, layer: str | int = "mean") -> Path:
    """Mean attention weight (log scale) against distance, one line per model, from :func:`attention_by_distance`
    curves. ``layer``: "mean" (averaged over layers), "last", "both" (two panels) or a layer index."""
    panels = _layer_panels(layer)
    figure, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for axis, (title, pick) in zip(axes[0], panels):
        for name, curve in curves.items():
            values = pick(curve.float())
            axis.plot(range(len(values)), values.numpy(), label=name, linewidth=1)
        axis.set_yscale("log")
        axis.set_xlabel("query-key distance (tokens)")
        axis.set_ylabel("mean attention weight")
        axis.set_title(title, fontsize=9)
        axis.legend(fontsize=7)
    return save_figure(figure, Path(path))


# --- T5 buckets ---------------------------------------------------------------------------------------------------


def has_t5_buckets(model: nn.Module) -> bool:
    """Whether the model's own bias is T5's buckets (a t5-bias model; TUPE-R's buckets ride inside TUPE's)."""
    return isinstance(getattr(find_sites(model).self_attentions()[0], "posswap_bias", None), T5Buckets)


def t5_provider(model: nn.Module) -> T5Buckets:
    """The first layer's T5 buckets: a t5-bias model's (shared or per layer), or TUPE-R's relative part."""
    provider = getattr(find_sites(model).self_attentions()[0], "posswap_bias", None)
    provider = provider.relative if isinstance(provider, TupeBias) else provider
    if not isinstance(provider, T5Buckets):
        raise ValueError(f"This model ({method_of(model)}) has no T5 bucket bias; patch it with method t5-bias.")
    return provider


def t5_bias_by_distance(model: nn.Module, max_distance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Distances i - j (query minus key: -max_distance..max_distance for encoders, 0..max_distance for decoders)
    and the first layer's bias at each, (heads, distances) float32 on the CPU."""
    provider = t5_provider(model)
    start = -max_distance if provider.bidirectional else 0
    distances = torch.arange(start, max_distance + 1)
    device = provider.relative_attention_bias.weight.device
    buckets = t5_buckets(-distances.to(device), provider.bidirectional, provider.num_buckets, provider.max_distance)
    with torch.no_grad():  # T5's relative position is key minus query
        bias = provider.relative_attention_bias(buckets).t().float().cpu()
    return distances, bias


def plot_t5_buckets(model: nn.Module, path: Path, max_distance: int) -> Path:
    """The first layer's T5 bias per head (one line each) against query-minus-key distance."""
    distances, bias = t5_bias_by_distance(model, max_distance)
    shared = len(find_sites(model).base.posswap_bias_providers) == 1
    figure, axes = plt.subplots(figsize=(6, 4))
    for head, values in enumerate(bias):
        axes.plot(distances.numpy(), values.numpy(), label=f"head {head}", linewidth=1)
    provider = t5_provider(model)
    reach = provider.max_distance  # past it every distance shares the last bucket
    for edge in ((-reach, reach) if provider.bidirectional else (reach,)) if reach <= max_distance else ():
        axes.axvline(edge, color="grey", linestyle=":", linewidth=1)
    axes.set_xlabel("distance i - j (query minus key); dotted: the buckets' max_distance")
    axes.set_ylabel("bias added to the logit")
    axes.set_title(f"T5 buckets, {'shared by all layers' if shared else 'first layer of per-layer tables'}", fontsize=9)
    if len(bias) <= 16:
        axes.legend(fontsize=7, ncol=2)
    return save_figure(figure, Path(path))
