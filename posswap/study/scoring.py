"""Scoring for the study: every model on every held-out set at each length, and the repeat probe; one model in
memory at a time, each on the study's device."""

from __future__ import annotations

import json
from pathlib import Path

from ..evaluation import Results, evaluate
from .plan import BaseSpec

ORIGINAL = "original"
SLIDING = "original (sliding)"
BASELINE = "original trained"
OTHER_MASKS = "original, mask seed 1"


def set_name(data: str) -> str:
    """``posswap:austen-heldout`` -> ``austen-heldout``: the file name of a held-out set's results."""
    return data.removeprefix("posswap:").replace("/", "_")


def loss_metric(causal: bool) -> str:
    return "loss" if causal else "mlm_loss"


def _load(model):
    """A model from a folder (a trained run), a function that builds it (untrained), or the model itself."""
    from ..loading import from_pretrained

    if isinstance(model, (str, Path)):
        return from_pretrained(str(model))
    return model() if callable(model) else model


class Scorer:
    """Scores models of one base: ``models`` maps a name to a folder or to a function that builds the model."""

    def __init__(self, spec: BaseSpec, tokenizer, causal: bool, device=None):
        self.spec, self.tokenizer, self.causal, self.device = spec, tokenizer, causal, device

    def _evaluate(self, models: dict, lengths: list[int], data: str, beyond: str, seed: int = 0) -> Results:
        return evaluate(models, self.tokenizer, lengths, data, beyond=beyond, max_tokens=self.spec.eval_tokens, device=self.device, seed=seed)

    def originals(self, original: Path, lengths: list[int]) -> dict[str, Results]:
        """Per held-out set: the original past its limit read in pieces (truncate) and, causal, with a sliding
        window; masked, also with other masks (the noise floor: the same model, other masked tokens)."""
        scored = {}
        for data in self.spec.heldout:
            results = self._evaluate({ORIGINAL: str(original)}, lengths, data, "truncate")
            if self.causal:
                results.models.update(self._evaluate({SLIDING: str(original)}, lengths, data, "sliding").models)
            else:
                results.models.update(self._evaluate({OTHER_MASKS: str(original)}, lengths, data, "truncate", seed=1).models)
            scored[data] = results
        return scored

    def variants(self, originals: dict[str, Results], models: dict, lengths: list[int]) -> dict[str, Results]:
        """Per held-out set: ``originals`` (re-read at ``lengths``) plus each model; a causal model read past its
        limit slides (its best chance), a masked one reads in pieces. Each model is loaded once for all sets."""
        beyond = "sliding" if self.causal else "truncate"
        scored = {}
        for data, results in originals.items():
            keep = [results.lengths.index(n) for n in lengths]
            scored[data] = Results(lengths=list(lengths), data=data, settings=dict(results.settings), models={
                name: _at(result, keep) for name, result in results.models.items()
            })
            scored[data].settings["beyond"] = f"{ORIGINAL}: truncate (pieces); {'others: sliding' if self.causal else 'all: truncate'}"
        for name, model in models.items():
            loaded = _load(model)
            for data in self.spec.heldout:
                scored[data].models.update(self._evaluate({name: loaded}, lengths, data, beyond).models)
            del loaded
        return scored

    def probe(self, models: dict, progress: bool = True) -> dict:
        """The repeat probe of every model on the first held-out set (same spans and fillers for all)."""
        from ..data.splits import load_text_dataset
        from ..evaluation.repeat import repeat_probe
        from ..evaluation.stream import context_limit, resolve_device, token_stream

        probe = self.spec.probe
        texts = load_text_dataset(self.spec.heldout_data)["text"]
        distances = probe.distances(self.spec.length)
        stream = token_stream(texts, self.tokenizer, 200_000, min_tokens=probe.span + max(distances))
        device = resolve_device(self.device)
        found = {"span": probe.span, "multiples": list(probe.multiples), "length": self.spec.length, "data": self.spec.heldout_data, "models": {}}
        for name, model in models.items():
            loaded = _load(model).eval().to(device)
            limit = context_limit(loaded)  # past it: a sliding window (causal) or pieces (masked)
            found["models"][name] = repeat_probe(
                loaded, self.tokenizer, stream, span=probe.span, distances=distances,
                spans_per_distance=probe.spans, limit=limit, progress=progress,
            )
            del loaded
        return found


def _at(result, keep: list[int]):
    """A model's results at some of its lengths (the originals are scored once, at every length)."""
    from dataclasses import replace

    metrics = {k: [v[i] for i in keep] if isinstance(v, list) and len(v) > max(keep) else v for k, v in result.metrics.items()}
    per_position = [result.per_position[i] for i in keep] if len(result.per_position) > max(keep) else result.per_position
    return replace(result, metrics=metrics, per_position=per_position, passkey=None)


def save_sets(scored: dict[str, Results], folder: Path) -> None:
    for data, results in scored.items():
        results.save(folder / f"{set_name(data)}.json")


def load_sets(spec: BaseSpec, folder: Path) -> dict[str, Results]:
    return {data: Results.load(folder / f"{set_name(data)}.json") for data in spec.heldout}


def write_json(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")
    return path
