"""Scoring for the study: every model on every held-out set at each length, and the repeat probe; one model in
memory at a time, each on the study's device."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, replace
from pathlib import Path

from ..evaluation import ModelResults, Results, evaluate
from ..portable.posswap_files import absolute, hold
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


def window_losses(results: Results, name: str, i: int, metric: str) -> list[float] | None:
    """``name``'s per-window losses at ``results.lengths[i]`` (None where the model or the windows are missing)."""
    model = results.models.get(name)
    found = model.metrics.get(f"{metric}_windows") if model is not None else None
    return found[i] if found is not None else None


def identity(model) -> dict:
    """What a score depends on, of the model: its folder and the time its weights were written (a retrained run
    is a new model), or, untrained, the recipe that builds it (an object with ``raw``)."""
    if isinstance(model, (str, Path)):
        weights = sorted(Path(model).glob("*.safetensors")) or [Path(model) / "config.json"]
        return {"folder": str(Path(model).resolve()), "written": [f.stat().st_mtime_ns for f in weights]}
    raw = getattr(model, "raw", None)
    if raw is None:
        raise TypeError(
            f"Cannot tell what {model!r} is: give a folder or an object with the recipe (raw) that builds it."
        )
    return {"untrained": raw.get("posswap"), "from": str(Path(raw["model"]).resolve())}


class ScoreCache:
    """Scores already computed, kept as JSON files in the work folder, so an interrupted phase does not score a
    model twice. A score is found by everything it depends on (the model's identity and the settings)."""

    def __init__(self, folder: Path | None):
        self.folder = Path(folder) if folder is not None else None

    def _file(self, key: dict) -> Path:
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]
        return self.folder / f"{digest}.json"

    def get(self, key: dict):
        path = None if self.folder is None else self._file(key)
        if path is None or not path.exists():
            return None
        try:
            return json.loads(path.read_text())["value"]
        except (ValueError, KeyError, TypeError) as error:  # cut short or overwritten on disk: scored again
            set_aside(path, damage(error))
            return None

    def put(self, key: dict, value) -> None:
        if self.folder is not None:
            write_json(self._file(key), {"key": key, "value": value})


def _with_windows(value: dict | None) -> dict | None:
    """A cached score from before the per-window losses were kept counts as missing: comparisons need them."""
    if value is None or not any(name.endswith("_windows") for name in value["metrics"]):
        return None
    return value


def _load(model):
    """A model from a folder (a trained run), a function that builds it (untrained), or the model itself."""
    from ..loading import from_pretrained

    if isinstance(model, (str, Path)):
        return from_pretrained(str(model))
    return model() if callable(model) else model


class Scorer:
    """Scores models of one base: ``models`` maps a name to a folder or to an object that builds the model when
    called and carries its recipe as ``raw``. With ``cache``, every score is kept there and found again."""

    def __init__(self, spec: BaseSpec, tokenizer, causal: bool, device=None, cache: Path | None = None):
        self.spec, self.tokenizer, self.causal, self.device = spec, tokenizer, causal, device
        self.cache = ScoreCache(cache)

    def _evaluate(self, models: dict, lengths: list[int], data: str, beyond: str, seed: int = 0) -> Results:
        return evaluate(
            models,
            self.tokenizer,
            lengths,
            data,
            beyond=beyond,
            max_tokens=self.spec.eval_tokens,
            device=self.device,
            seed=seed,
        )

    def _score(self, name: str, model, lengths: list[int], beyond: str, seed: int = 0) -> dict[str, ModelResults]:
        """``model`` on every held-out set (loaded once, and only if some set is not in the cache)."""
        keys = {
            data: {
                "model": identity(model),
                "lengths": list(lengths),
                "data": data,
                "beyond": beyond,
                "seed": seed,
                "tokens": self.spec.eval_tokens,
            }
            for data in self.spec.heldout
        }
        found = {data: _with_windows(self.cache.get(key)) for data, key in keys.items()}
        if any(value is None for value in found.values()):
            loaded = _load(model)
            for data, key in keys.items():
                if found[data] is None:
                    found[data] = asdict(self._evaluate({name: loaded}, lengths, data, beyond, seed).models[name])
                    self.cache.put(key, found[data])
            del loaded
        return {data: ModelResults(**value) for data, value in found.items()}

    def originals(self, original: Path, lengths: list[int]) -> dict[str, Results]:
        """Per held-out set: the original past its limit read in pieces (truncate) and, causal, with a sliding
        window; masked, also with other masks (the noise floor: the same model, other masked tokens)."""
        readings = [(ORIGINAL, "truncate", 0), (SLIDING, "sliding", 0) if self.causal else (OTHER_MASKS, "truncate", 1)]
        scored = {
            data: Results(lengths=list(lengths), data=data, settings={"max_tokens": self.spec.eval_tokens})
            for data in self.spec.heldout
        }
        for name, beyond, seed in readings:
            for data, result in self._score(name, str(original), lengths, beyond, seed).items():
                scored[data].models[name] = result
        return scored

    def variants(self, originals: dict[str, Results], models: dict, lengths: list[int]) -> dict[str, Results]:
        """Per held-out set: ``originals`` (re-read at ``lengths``) plus each model; a causal model read past its
        limit slides (its best chance), a masked one reads in pieces. Each model is loaded once for all sets."""
        beyond = "sliding" if self.causal else "truncate"
        scored = {}
        for data, results in originals.items():
            keep = [results.lengths.index(n) for n in lengths]
            scored[data] = Results(
                lengths=list(lengths),
                data=data,
                settings=dict(results.settings),
                models={name: _at(result, keep) for name, result in results.models.items()},
            )
            scored[data].settings["beyond"] = (
                f"{ORIGINAL}: truncate (pieces); {'others: sliding' if self.causal else 'all: truncate'}"
            )
        for name, model in models.items():
            for data, result in self._score(name, model, lengths, beyond).items():
                scored[data].models[name] = result
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
        found = {
            "span": probe.span,
            "multiples": list(probe.multiples),
            "length": self.spec.length,
            "data": self.spec.heldout_data,
            "models": {},
        }
        for name, model in models.items():
            key = {
                "model": identity(model),
                "probe": asdict(probe),
                "length": self.spec.length,
                "data": self.spec.heldout_data,
            }
            found["models"][name] = self.cache.get(key)
            if found["models"][name] is None:
                loaded = _load(model).eval().to(device)
                limit = context_limit(loaded)  # past it: a sliding window (causal) or pieces (masked)
                found["models"][name] = repeat_probe(
                    loaded,
                    self.tokenizer,
                    stream,
                    span=probe.span,
                    distances=distances,
                    spans_per_distance=probe.spans,
                    limit=limit,
                    progress=progress,
                )
                self.cache.put(key, found["models"][name])
                del loaded
        return found


def _at(result, keep: list[int]):
    """A model's results at some of its lengths (the originals are scored once, at every length)."""
    metrics = {
        k: [v[i] for i in keep] if isinstance(v, list) and len(v) > max(keep) else v for k, v in result.metrics.items()
    }
    per_position = (
        [result.per_position[i] for i in keep] if len(result.per_position) > max(keep) else result.per_position
    )
    return replace(result, metrics=metrics, per_position=per_position, passkey=None)


def save_sets(scored: dict[str, Results], folder: Path) -> None:
    for data, results in scored.items():
        results.save(folder / f"{set_name(data)}.json")


def load_sets(spec: BaseSpec, folder: Path) -> dict[str, Results]:
    return {data: Results.load(folder / f"{set_name(data)}.json") for data in spec.heldout}


def write_json(path: Path, value, indent: int | None = 2) -> Path:
    """Write ``value`` whole or not at all (beside, then renamed over): a killed study never leaves a cut file that
    the next run would fail to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps(value, indent=indent) + "\n")
    os.replace(staging, path)
    return path


def damage(error: Exception) -> str:
    """What is wrong with a work-folder file that did not read back, in a few words."""
    if isinstance(error, UnicodeDecodeError):
        return "not text"
    if isinstance(error, (KeyError, TypeError, AttributeError)):
        return f"not the expected record ({type(error).__name__}: {error})"
    return f"not readable: {' '.join(str(error).split())}"


def set_aside(path: Path, why: str) -> Path:
    """Move a damaged file (or a model folder) of the work folder aside as ``NAME.damaged`` (numbered when taken), with
    one line that says so; its caller computes it again. Never deleted: it may be all that is left of a long run."""
    aside, n = path.with_name(f"{path.name}.damaged"), 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.damaged-{n}"), n + 1
    os.replace(path, aside)
    print(f"posswap study: {path} is damaged ({why}); set aside as {aside.name}, computing it again.", flush=True)
    return aside


@contextlib.contextmanager
def hold_work(work: Path):
    """One study per work folder: a second one on the same folder is refused at once (``Busy``, a ``ValueError``),
    before it reads or writes anything there; the first goes on unharmed."""

    def refusal(pid: int | None, by: str | None) -> str:
        return (
            f"another posswap study (pid {pid if pid is not None else 'unknown'}) is using the work folder {work} now; "
            "wait for it to finish, or choose another --work."
        )

    with hold(absolute(work), "posswap study", refusal):
        yield
