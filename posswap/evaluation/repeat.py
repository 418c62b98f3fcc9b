"""Repeated text at a distance: does a model *use* tokens far back? A held-out span of ``span`` tokens, then
``d`` tokens of other held-out text (the filler), then the same span again. A model that reads back across the
filler predicts the repeat much better than the first occurrence; one that cannot (its window is too short,
or its positions past the trained length mean nothing to it) does not. ``drop`` is that gain, in nats.

Spans and fillers come from different, non-overlapping places of the stream, drawn from ``seed`` and ``d``,
so every model reads the same sequences."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from ..config import check_number
from .causal import window_losses
from .harness import model_kind
from .masked import masked_lm_scores, with_special_tokens
from .stream import context_limit, model_device

BATCH = 8  # trials per forward pass when one pass reads a whole sequence: speed on CPU, modest memory
MODEL_LIMIT = "model"  # repeat_probe's default limit: the model's own (context_limit)


def check_probe(stream: torch.Tensor, span: int, distances, spans_per_distance: int, seed: int) -> list[int]:
    """Refuse settings that cannot work, naming them; returns the distances as a list."""
    check_number("span", span, minimum=2, integer=True)  # the causal first occurrence scores span - 1 tokens
    if not isinstance(distances, (list, tuple)) or not distances:
        raise ValueError(f"distances must be a non-empty list of token counts, got {distances!r}.")
    for d in distances:
        check_number("distances entries", d, minimum=0, integer=True)
    check_number("spans_per_distance", spans_per_distance, minimum=1, integer=True)
    check_number("seed", seed, minimum=0, integer=True)
    needed = span + max(distances)
    if len(stream) < needed:
        raise ValueError(
            f"The repeat probe needs a stream of at least span + distance = {span} + {max(distances)} = {needed} "
            f"tokens (span and filler may not overlap); the stream has {len(stream)}. Use a shorter span or "
            "distances, or more text."
        )
    return list(distances)


def _generator(seed: int, d: int, salt: int = 0) -> torch.Generator:
    # One generator per (seed, distance): a distance's trials do not depend on which other distances are asked.
    return torch.Generator().manual_seed(seed * 1_000_003 + d * 7 + salt)


def draw_trials(
    stream: torch.Tensor, span: int, d: int, count: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` (span, filler) pairs: two non-overlapping stretches of ``stream`` placed uniformly at random,
    in either order. Two start points u <= v in the stream less both lengths: the first stretch starts at u,
    the second at v plus the first's length, so they never overlap and may sit anywhere."""
    generator, free = _generator(seed, d), len(stream) - span - d
    trials = []
    for _ in range(count):
        u, v = sorted(torch.randint(0, free + 1, (2,), generator=generator).tolist())
        if torch.randint(0, 2, (1,), generator=generator).item():  # span first
            a, b = u, v + span
        else:
            b, a = u, v + d
        trials.append((stream[a : a + span], stream[b : b + d]))
    return trials


def _summary(reference: list[float], repeat: list[float], read_as: str) -> dict:
    """Means over trials, and the standard error of the drop (None with one trial: no spread to measure)."""
    reference_t, repeat_t = torch.tensor(reference, dtype=torch.float64), torch.tensor(repeat, dtype=torch.float64)
    drop = reference_t - repeat_t
    se = (drop.std() / math.sqrt(len(drop))).item() if len(drop) > 1 else None
    means = {"reference": reference_t.mean().item(), "repeat": repeat_t.mean().item(), "drop": drop.mean().item()}
    return {**means, "drop_se": se, "n": len(drop), "read_as": read_as}


def _collect(kind: str, span: int, distances: list[int], rows: list[dict]) -> dict:
    """One dict of lists aligned with ``distances`` (JSON as it is)."""
    fields = ("reference", "repeat", "drop", "drop_se", "n", "read_as")
    return {"kind": kind, "span": span, "distances": distances, **{f: [row[f] for row in rows] for f in fields}}


# --- causal ------------------------------------------------------------------------------------------------


def _occurrence_means(nll: torch.Tensor, span: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean NLL of the first occurrence (positions 1 .. span-1: token 0 has no context) and of the same
    offsets in the repeat (span+d+1 .. 2 span+d-1), from ``nll`` indexed by position along the last axis."""
    return nll[..., 1:span].mean(-1), nll[..., span + d + 1 : 2 * span + d].mean(-1)


@torch.no_grad()
def _causal_full(model: nn.Module, sequences: torch.Tensor) -> torch.Tensor:
    """(trials, length) NLL by position of sequences short enough for one pass, ``BATCH`` at a time; position 0
    (never predicted) is NaN."""
    device, parts = model_device(model), []
    for batch in sequences.split(BATCH):
        ids = batch.to(device)
        logits = model(input_ids=ids).logits[:, :-1].float()
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").cpu()
        parts.append(torch.cat([torch.full((len(batch), 1), math.nan), nll], dim=1))
    return torch.cat(parts)


def _causal_sliding(model: nn.Module, sequence: torch.Tensor, limit: int) -> torch.Tensor:
    """NLL by position of one sequence longer than ``limit``, read as the harness reads causal models past
    their limit: a sliding window of the model's length."""
    losses, _ = window_losses(model, sequence, limit, "sliding", None)
    nll = torch.full((len(sequence),), math.nan)
    nll[losses.position] = losses.nll
    return nll


@torch.no_grad()
def repeat_probe_causal(
    model: nn.Module,
    stream: torch.Tensor,
    span: int,
    distances,
    spans_per_distance: int,
    limit: int | None,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """The probe for a causal LM. Sequence = span + filler(d) + span; ``reference`` is the mean next-token NLL
    of the first occurrence (its tokens 1 .. span-1), ``repeat`` that of the same tokens in the second, and
    ``drop`` = reference - repeat per trial (positive: the repeat helped). A sequence longer than ``limit`` is
    read with a sliding window of ``limit`` tokens (``read_as`` "sliding"), else in one pass ("full")."""
    distances = check_probe(stream, span, distances, spans_per_distance, seed)
    rows = []
    with tqdm(total=len(distances) * spans_per_distance, desc="repeat probe (causal)", disable=not progress) as bar:
        for d in distances:
            sequences = torch.stack(
                [torch.cat([s, f, s]) for s, f in draw_trials(stream, span, d, spans_per_distance, seed)]
            )
            if limit is None or sequences.shape[1] <= limit:
                nll, read_as = _causal_full(model, sequences), "full"
            else:
                nll, read_as = torch.stack([_causal_sliding(model, seq, limit) for seq in sequences]), "sliding"
            bar.update(spans_per_distance)
            reference, repeat = _occurrence_means(nll, span, d)
            rows.append(_summary(reference.tolist(), repeat.tolist(), read_as))
    return _collect("causal", span, distances, rows)


# --- masked ------------------------------------------------------------------------------------------------


def _content_start(tokenizer) -> int:
    """Index of the first content token once the special tokens are added (1 for BERT's [CLS])."""
    marked = with_special_tokens(torch.tensor([-1]), tokenizer)
    return int(torch.nonzero(marked == -1)[0, 0])


def mask_offsets(span: int, d: int, count: int, seed: int, fraction: float) -> list[torch.Tensor]:
    """Per trial, the sorted span offsets to mask: ``fraction`` of the span (at least one), seeded apart from
    the draw of the text, so the spans are those the causal probe reads with the same seed."""
    generator, size = _generator(seed, d, salt=1), max(1, round(fraction * span))
    return [torch.randperm(span, generator=generator)[:size].sort().values for _ in range(count)]


def masked_conditions(
    sequence: torch.Tensor, first: int, second: int, offsets: torch.Tensor, mask_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(copy visible, no copy, labels) for one sequence whose occurrences start at ``first`` and ``second``.
    Copy visible masks ``offsets`` in the repeat only; no copy masks them in both occurrences. Only the
    repeat's masked tokens are labelled, in both conditions, so the two losses are over the same tokens."""
    copy, hidden, labels = sequence.clone(), sequence.clone(), torch.full_like(sequence, -100)
    copy[second + offsets] = mask_id
    hidden[second + offsets] = mask_id
    hidden[first + offsets] = mask_id
    labels[second + offsets] = sequence[second + offsets]
    return copy, hidden, labels


@torch.no_grad()
def _masked_nll(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, limit: int | None
) -> tuple[list[float], str]:
    """Mean NLL of the labelled tokens per row. Rows that fit run ``BATCH`` at a time; longer ones are read as
    masked_lm_scores reads them (consecutive pieces of the model's length, "truncate")."""
    if limit is not None and inputs.shape[1] > limit:
        return [masked_lm_scores(model, [(x, y)], limit)[0].loss for x, y in zip(inputs, labels)], "truncate"
    device, means = model_device(model), []
    for ids, gold in zip(inputs.split(BATCH), labels.split(BATCH)):
        logits = model(input_ids=ids.to(device)).logits.float().cpu()
        nll = F.cross_entropy(logits.transpose(1, 2), gold, reduction="none")  # 0 where gold is -100
        means += (nll.sum(1) / (gold != -100).sum(1)).tolist()
    return means, "full"


@torch.no_grad()
def repeat_probe_masked(
    model: nn.Module,
    tokenizer,
    stream: torch.Tensor,
    span: int,
    distances,
    spans_per_distance: int,
    limit: int | None,
    seed: int = 0,
    mask_fraction: float = 0.15,
    progress: bool = True,
) -> dict:
    """The masked-LM analogue of the causal probe. Sequence = [CLS] span filler(d) span [SEP]; a seeded set M
    of span offsets (``mask_fraction`` of the span, at least one) is replaced by the mask token (no 80/10/10).
    ``repeat`` is the mean NLL of the repeat's tokens at M when the first occurrence is fully visible (the
    copy can be read); ``reference`` that of the same tokens when M is masked in both occurrences (nothing to
    copy); ``drop`` = reference - repeat per trial. A sequence longer than ``limit`` is read in consecutive
    pieces of ``limit`` tokens (``read_as`` "truncate"), so a copy across a piece boundary is invisible:
    the model cannot read it, and the probe says so."""
    distances = check_probe(stream, span, distances, spans_per_distance, seed)
    check_number("mask_fraction", mask_fraction, above=0, maximum=1)
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no mask token; the masked repeat probe needs one.")
    start, rows = _content_start(tokenizer), []
    with tqdm(total=len(distances) * spans_per_distance, desc="repeat probe (masked)", disable=not progress) as bar:
        for d in distances:
            trials = draw_trials(stream, span, d, spans_per_distance, seed)
            offsets = mask_offsets(span, d, spans_per_distance, seed, mask_fraction)
            built = [
                masked_conditions(
                    with_special_tokens(torch.cat([s, f, s]), tokenizer),
                    start,
                    start + span + d,
                    m,
                    tokenizer.mask_token_id,
                )
                for (s, f), m in zip(trials, offsets)
            ]
            copy, hidden, labels = (torch.stack(part) for part in zip(*built))
            # Both conditions in one list: one batch can hold a trial's two rows.
            nll, read_as = _masked_nll(model, torch.cat([copy, hidden]), torch.cat([labels, labels]), limit)
            bar.update(spans_per_distance)
            rows.append(_summary(nll[spans_per_distance:], nll[:spans_per_distance], read_as))
    return _collect("masked", span, distances, rows)


# --- entry point -------------------------------------------------------------------------------------------


def repeat_probe(
    model: nn.Module,
    tokenizer,
    stream: torch.Tensor,
    *,
    span: int,
    distances,
    spans_per_distance: int = 20,
    limit: int | None | str = MODEL_LIMIT,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """The repeat probe for a causal or masked LM (see :func:`repeat_probe_causal`, :func:`repeat_probe_masked`).
    ``limit``: tokens the model reads; the default ``"model"`` is :func:`context_limit` of the model, None is
    no limit. Returns a JSON-ready dict: ``kind``, ``span``, ``distances`` and, one entry per distance,
    ``reference``, ``repeat``, ``drop`` (reference - repeat, nats), ``drop_se``, ``n`` and ``read_as``."""
    kind = model_kind(model)
    if kind == "encoder":
        raise ValueError(
            f"{type(model).__name__} has no LM head: the repeat probe scores tokens, so it needs a causal or "
            "masked LM (AutoModelForCausalLM / AutoModelForMaskedLM)."
        )
    if limit == MODEL_LIMIT:
        limit = context_limit(model)
    elif limit is not None:
        check_number("limit", limit, minimum=2, integer=True)
    vocab = getattr(model.config, "vocab_size", None)
    if vocab is not None and len(stream) and int(stream.max()) >= vocab:
        raise ValueError(
            f"The stream has ids up to {int(stream.max())} but the model has a vocabulary of {vocab}: "
            "tokenise with the tokenizer the model was trained with."
        )
    model.eval()  # dropout would make the two occurrences differ by noise
    if kind == "causal":
        return repeat_probe_causal(model, stream, span, distances, spans_per_distance, limit, seed, progress=progress)
    return repeat_probe_masked(
        model, tokenizer, stream, span, distances, spans_per_distance, limit, seed, progress=progress
    )
