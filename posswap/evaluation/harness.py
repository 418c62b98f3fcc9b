"""``posswap.evaluate``: every model, every length, the same text and the same masks / keys."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from ..config import check_choice, check_flags, check_number
from ..portable.posswap_architectures import ARCHITECTURES
from .causal import BEYOND, TokenLosses, sliding_losses, window_losses
from .masked import mask_windows, masked_lm_scores, with_special_tokens
from .passkey import DEPTHS, build_prompt, passkey_found, random_keys, shortest_prompt
from .results import ModelResults, Results
from .similarity import adjacent_similarity, learned_table
from .stream import context_limit, model_device, resolve_device, token_stream, windows

DEFAULT_DATA = "posswap:austen-heldout"
POSITION_BUCKETS = 8


def model_kind(model: nn.Module) -> str:
    """``causal`` (decoder with an LM head), ``masked`` (encoder with an MLM head) or ``encoder`` (no head that
    scores tokens: hidden states or a classifier, so only position maps can be shown)."""
    config = model.config
    arch = ARCHITECTURES.get(config.model_type)
    causal = arch.causal if arch is not None else bool(getattr(config, "is_decoder", False))
    if model.get_output_embeddings() is None:
        return "encoder"
    return "causal" if causal else "masked"


def evaluate(
    models: dict[str, Any],
    tokenizer: Any = None,
    lengths: list[int] = (256, 512, 1024),
    data: Any = DEFAULT_DATA,
    *,
    stride: int | None = None,
    beyond: str = "truncate",
    max_tokens: int = 8192,
    passkey_trials: int = 0,
    passkey_depths: tuple[float, ...] = DEPTHS,
    seed: int = 0,
    out: str | Path | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> Results:
    """Score ``models`` (name -> model, or a Hub id / folder loaded with :func:`posswap.from_pretrained`) at
    each length in ``lengths`` on ``data`` (a ``--data`` string, see :func:`load_text_dataset`, or a list of
    texts). ``max_tokens`` is the budget of scored tokens per model and length. With ``out``, also writes
    ``results.json`` and the PNG plots there. Models run on ``device`` (default: cuda when there is a GPU, else
    cpu); a model handed in as an object goes back to its own device afterwards."""
    from ..data.splits import load_text_dataset
    from ..files import check_output_dir
    from ..loading import load_transformers_model  # a sentence-transformers folder: its transformer
    from .plots import plot_similarity, slug, write_plots  # here: `import posswap` need not load matplotlib

    check_flags(progress=progress)
    lengths = check_settings(lengths, beyond, stride, max_tokens, passkey_trials, passkey_depths, seed)
    device = resolve_device(device)
    if out is not None:
        check_output_dir(out, flag="out")  # a file in the way fails now, not after the scoring
    tokenizer = _tokenizer(tokenizer, models)
    texts = load_text_dataset(data)["text"] if isinstance(data, str) else list(data)
    stream = token_stream(texts, tokenizer, max(max_tokens, lengths[-1]), min_tokens=lengths[-1])

    settings = dict(stride=stride, beyond=beyond, max_tokens=max_tokens, seed=seed, passkey_trials=passkey_trials)
    results = Results(lengths=lengths, data=data if isinstance(data, str) else "<texts>", settings=settings)
    for name, spec in models.items():
        # One model in memory at a time: a stock model and its 4k variants need not fit together.
        model = (load_transformers_model(spec) if isinstance(spec, (str, Path)) else spec).eval()
        home, movable = model_device(model), getattr(model, "hf_device_map", None) is None  # device_map=: stays put
        if movable:
            model.to(device)
        results.models[name] = _score_model(model, name, tokenizer, stream, lengths, settings, passkey_depths, progress)
        if movable and model is spec:
            model.to(home)
        if out is not None and model.config.model_type in ARCHITECTURES:
            plot_similarity(model, name, Path(out) / f"similarity_{slug(name)}.png")
    if out is not None:
        results.save(Path(out) / "results.json")
        write_plots(results, Path(out))
    return results


def _score_model(
    model, name: str, tokenizer, stream, lengths: list[int], settings: dict, passkey_depths, progress: bool
) -> ModelResults:
    """One model at every length: loss (causal or masked), the passkey (causal), the table's adjacent similarity."""
    stride, beyond, max_tokens = settings["stride"], settings["beyond"], settings["max_tokens"]
    seed, passkey_trials = settings["seed"], settings["passkey_trials"]
    kind = model_kind(model)
    result = ModelResults(kind=kind, limit=context_limit(model))
    vocab = getattr(model.config, "vocab_size", None)
    if kind != "encoder" and vocab is not None and int(stream.max()) >= vocab:
        raise ValueError(
            f"The tokenizer gives ids up to {int(stream.max())} but {name} has a vocabulary of {vocab}: "
            "pass the tokenizer the model was trained with (--tokenizer)."
        )
    if kind == "causal":
        _score_causal(model, name, stream, lengths, result, stride, beyond, max_tokens, progress)
        if passkey_trials > 0:
            result.passkey = _passkey(
                model, name, tokenizer, lengths, result.limit, passkey_trials, passkey_depths, seed, progress
            )
            result.metrics["passkey"] = [_mean(row) for row in result.passkey["accuracy"]]
            if None in result.metrics["passkey"]:
                result.notes.append("passkey needs a few dozen tokens of prompt: '-' where a length is shorter.")
    elif kind == "masked":
        _score_masked(model, name, tokenizer, stream, lengths, result, seed, max_tokens, progress)
    else:
        result.notes.append(
            f"{type(model).__name__} has no LM head: MLM loss needs one (save or load the checkpoint with "
            "AutoModelForMaskedLM / AutoModelForCausalLM); only its position table is measured."
        )
    if kind == "masked" and beyond == "sliding" and result.limit is not None and lengths[-1] > result.limit:
        result.notes.append("masked LMs read lengths past their limit in pieces (truncate); sliding is for causal LMs.")
    table = learned_table(model) if model.config.model_type in ARCHITECTURES else None
    if table is not None:  # says something even about an encoder with no head
        result.metrics["adjacent_cos"] = [adjacent_similarity(table, length) for length in lengths]
    return result


def check_settings(
    lengths, beyond="truncate", stride=None, max_tokens=8192, passkey_trials=0, passkey_depths=DEPTHS, seed=0, prefix=""
) -> list[int]:
    """Refuse evaluation settings that cannot work (``prefix``: where they come from, e.g. ``eval.``);
    returns the sorted distinct lengths. Recipes call this before training, so a bad value never waits
    for the end of a run."""
    if not isinstance(lengths, (list, tuple)) or not lengths:
        raise ValueError(f"{prefix}lengths must be a non-empty list of token counts, got {lengths!r}.")
    for length in lengths:
        check_number(f"{prefix}lengths entries", length, minimum=2, integer=True)
    check_choice(f"{prefix}beyond", beyond, BEYOND)
    if stride is not None:
        check_number(f"{prefix}stride", stride, minimum=1, integer=True)
    check_number(f"{prefix}max_tokens", max_tokens, minimum=1, integer=True)
    check_number(f"{prefix}passkey_trials", passkey_trials, minimum=0, integer=True)
    for depth in passkey_depths:
        check_number(f"{prefix}passkey depths", depth, minimum=0, maximum=1)
    check_number(f"{prefix}seed", seed, minimum=0, integer=True)
    return sorted(set(lengths))


def _tokenizer(tokenizer, models):
    from ..loading import load_tokenizer, resolve_model_id

    if tokenizer is None:
        paths = [m for m in models.values() if isinstance(m, (str, Path))]
        if not paths:
            raise ValueError("Pass a tokenizer: no model was given as a path to load one from.")
        tokenizer = paths[0]
    return load_tokenizer(resolve_model_id(str(tokenizer))) if isinstance(tokenizer, (str, Path)) else tokenizer


def _score_causal(model, name, stream, lengths, result, stride, beyond, max_tokens, progress):
    losses, errors, per_window, read_as, buckets = [], [], [], [], []
    for length in tqdm(lengths, desc=f"{name}: perplexity", disable=not progress):
        if stride is not None:
            # The perplexity guide over the whole budget: windows of `length` (or the model's own, past it).
            window = min(length, result.limit or length)
            scored = sliding_losses(model, stream[: max(max_tokens, length)], window, min(stride, window))
            how = f"stride {min(stride, window)}" + ("" if window == length else f" in {window}")
            position = scored.context  # index in the stream means nothing: bucket by place in the window
        else:
            parts = [window_losses(model, w, result.limit, beyond, None) for w in windows(stream, length, max_tokens)]
            scored, how = TokenLosses.cat([p[0] for p in parts]), parts[0][1]
            position = scored.position
            window_of = torch.cat([torch.full_like(p[0].nll, i, dtype=torch.long) for i, p in enumerate(parts)])
        if stride is not None:  # one long read: blocks of `length` stream tokens stand in for windows
            window_of = scored.position // length
        losses.append(scored.mean())
        per_window.append(window_means(scored.nll, window_of))
        errors.append(standard_error(per_window[-1]))
        read_as.append(how)
        buckets.append(_buckets(scored.nll, position, length))
    result.metrics["loss"] = losses
    result.metrics["loss_se"] = errors
    result.metrics["loss_windows"] = per_window
    result.metrics["ppl"] = [math.exp(v) if v < 700 else math.inf for v in losses]
    result.metrics["read_as"] = read_as
    result.per_position = buckets


def _score_masked(model, name, tokenizer, stream, lengths, result, seed, max_tokens, progress):
    special = tokenizer.num_special_tokens_to_add()
    loss, errors, per_window, accuracy, read_as, buckets = [], [], [], [], [], []
    for length in tqdm(lengths, desc=f"{name}: masked LM", disable=not progress):
        content = windows(stream, length - special, max_tokens)
        masked = mask_windows([with_special_tokens(w, tokenizer) for w in content], tokenizer, seed)
        scores, how = masked_lm_scores(model, masked, result.limit)
        loss.append(scores.loss)
        per_window.append(window_means(scores.nll, scores.window))
        errors.append(standard_error(per_window[-1]))
        accuracy.append(scores.accuracy)
        read_as.append(how)
        buckets.append(_buckets(scores.nll, scores.position, length))
    result.metrics.update(
        mlm_loss=loss, mlm_loss_se=errors, mlm_loss_windows=per_window, mlm_accuracy=accuracy, read_as=read_as
    )
    result.per_position = buckets


def _passkey(model, name, tokenizer, lengths, limit, trials, depths, seed, progress) -> dict:
    keys = random_keys(trials, seed)  # the same keys for every model
    shortest = shortest_prompt(tokenizer)
    accuracy = []
    with tqdm(total=len(lengths) * len(depths) * trials, desc=f"{name}: passkey", disable=not progress) as bar:
        for length in lengths:
            if length < shortest:  # too short to hold the prompt at all: not measured
                accuracy.append([None for _ in depths])
                bar.update(len(depths) * trials)
                continue
            row = []
            for depth in depths:
                found = 0
                for key in keys:
                    found += passkey_found(model, build_prompt(tokenizer, length, depth, key), limit)
                    bar.update()
                row.append(found / trials)
            accuracy.append(row)
    return {"depths": list(depths), "trials": trials, "accuracy": accuracy}


def window_means(nll: torch.Tensor, window: torch.Tensor) -> list[float]:
    """Mean loss of each window, in window order: kept in the results, so that two models read on the same
    windows can be compared pair by pair (:func:`paired_gap`)."""
    return [nll[window == w].double().mean().item() for w in window.unique()]


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean of ``values`` (per-window means: tokens within a window are not independent;
    windows of different text nearly are). None with fewer than two."""
    if len(values) < 2:
        return None
    return (torch.tensor(values, dtype=torch.float64).std() / len(values) ** 0.5).item()


def paired_gap(a: list[float], b: list[float]) -> tuple[float, float | None]:
    """Mean of ``a - b`` over the same windows and its standard error: the noise of a comparison between two
    models, much smaller than either model's own error when both find the same windows hard."""
    if len(a) != len(b):
        raise ValueError(f"Paired windows must match: {len(a)} against {len(b)}.")
    differences = [x - y for x, y in zip(a, b)]
    return sum(differences) / len(differences), standard_error(differences)


def _buckets(nll: torch.Tensor, position: torch.Tensor, length: int) -> dict:
    """Mean loss per equal-width position bucket of a ``length``-token window (None where nothing was scored)."""
    edges = torch.linspace(0, length, POSITION_BUCKETS + 1)
    index = torch.bucketize(position.float(), edges[1:-1], right=True)
    loss = [nll[index == b].mean().item() if (index == b).any() else None for b in range(POSITION_BUCKETS)]
    return {"edges": edges.tolist(), "loss": loss}


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
