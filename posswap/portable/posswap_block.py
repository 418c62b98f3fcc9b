"""The ``posswap`` block of a config.json, checked before anything is built from it.

A block that ``posswap.patch`` wrote always passes. A hand-edited one (a key removed, ``"128"`` for 128, 3.5
buckets, a length that no longer matches the model's) is refused with one line that names the folder, the block
and the key, instead of a KeyError or a ZeroDivisionError from inside the run time, or a model that loads and
gives other logits. Used by the classes of saved models (before they install anything) and by
``posswap.from_pretrained``.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .posswap_architectures import ARCHITECTURES
from .posswap_functional import RESAMPLE_MODES

CORE_KEYS = ("method", "max_length", "original_length")
_BACKENDS = (None, "sdpa", "flex", "eager")
_ABSOLUTE = ("drop", "keep")
_MODES = RESAMPLE_MODES


def _integer(minimum: int, maximum: int | None = None) -> Callable[[Any, dict], str | None]:
    def check(value, block):
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or value < minimum
            or (maximum is not None and value > maximum)
        ):
            return f"must be an integer >= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        return None

    return check


def _number(above: float | None = None, minimum: float | None = None, optional: bool = False):
    def check(value, block):
        if value is None and optional:
            return None
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        ok = ok and (above is None or value > above) and (minimum is None or value >= minimum)
        if not ok:
            bound = f" > {above}" if above is not None else f" >= {minimum}" if minimum is not None else ""
            return f"must be a finite number{bound}" + (" or null" if optional else "")
        return None

    return check


def _choice(*choices):
    def check(value, block):
        return None if value in choices else f"must be one of {', '.join(map(repr, choices))}"

    return check


def _boolean(optional: bool = False):
    def check(value, block):
        if isinstance(value, bool) or (optional and value is None):
            return None
        return "must be true or false" + (" (or null)" if optional else "")

    return check


def _rotary_dim(value, block):
    if value is None:
        return None
    fraction = isinstance(value, float) and 0 < value <= 1
    count = isinstance(value, int) and not isinstance(value, bool) and value > 0 and value % 2 == 0
    return None if fraction or count else "must be null, a fraction in (0, 1] or an even positive number of dims"


def _max_distance(value, block):
    buckets = block.get("num_buckets")
    floor = buckets // 2 + 1 if isinstance(buckets, int) else 1
    return _integer(floor)(value, block)


def _exact_short_inputs(value, block):
    if not isinstance(value, bool):
        return "must be true or false"
    return "needs mode 'stride'" if value and block.get("mode") != "stride" else None


def _text(value, block):
    return None if isinstance(value, str) else "must be a string"


# method -> key -> (required, check). Required: keys the run time reads without a default.
_KEYS: dict[str, dict[str, tuple[bool, Callable]]] = {
    "interpolate": {"mode": (False, _choice(*_MODES)), "exact_short_inputs": (False, _exact_short_inputs)},
    "rope": {
        "theta": (False, _number(above=1)),
        "rotary_dim": (False, _rotary_dim),
        "rope_type": (False, _choice(None, "linear", "dynamic", "yarn")),
        "factor": (False, _number(minimum=1, optional=True)),
        "absolute": (False, _choice(*_ABSOLUTE)),
        "backend": (False, _choice(*_BACKENDS)),
        "init": (False, _choice(None, "fit")),
    },
    "alibi": {
        "symmetric": (False, _boolean(optional=True)),
        "absolute": (False, _choice(*_ABSOLUTE)),
        "backend": (False, _choice(*_BACKENDS)),
    },
    "sinusoidal": {"theta": (True, _number(above=1)), "scale": (True, _number(above=0))},
    "nope": {},
    "t5-bias": {
        "num_buckets": (True, _integer(4, 65536)),
        "max_distance": (True, _max_distance),
        "per_layer": (False, _boolean()),
        "absolute": (False, _choice(*_ABSOLUTE)),
        "init": (False, _choice("zeros", "fit")),
        "backend": (False, _choice(*_BACKENDS)),
    },
    "tupe": {
        "cls_reset": (True, _boolean()),
        "relative": (False, _boolean()),
        "mode": (False, _choice(*_MODES)),
        "backend": (False, _choice(*_BACKENDS)),
    },
}
_COMMON = {"max_length": (True, _integer(1)), "original_length": (True, _integer(1)), "version": (False, _text)}
METHODS = tuple(_KEYS)


# Keys renamed since a block was first written: method -> {old: new}. Blocks in folders saved by an older posswap
# are read with the new names (migrate_block); a user's recipe or flag with an old name is refused, naming the new one.
RENAMED_KEYS = {"rope": {"scaling": "rope_type"}, "sinusoidal": {"base": "theta"}}
RENAMED_IN = "0.1.0"  # the release that renamed them (messages name it; the version moves on)


def migrate_block(block: Any) -> Any:
    """``block`` with the keys an older posswap wrote under their current names (the same object when nothing
    changes; anything that is not a block is returned as it is, for check_block to name)."""
    renamed = RENAMED_KEYS.get(block.get("method")) if isinstance(block, dict) else None
    if not renamed or not any(old in block for old in renamed):
        return block
    return {renamed.get(key, key): value for key, value in block.items()}


def _fail(where: str, text: str) -> ValueError:
    return ValueError(
        f"{where}/config.json: the 'posswap' block {text}. Put back the value posswap.patch wrote, or re-save the "
        "model with posswap (delete the block to load the model unpatched)."
    )


def check_block(block: Any, where: str, config: Any = None) -> None:
    """Raise ``ValueError`` (one line naming ``where``, the block and the key) unless ``block`` is one that
    ``posswap.patch`` could have written; with ``config``, also unless its length is the config's
    (``max_position_embeddings``, ``n_positions`` for GPT-2, less RoBERTa's padding offset)."""
    if block is None:
        return
    if not isinstance(block, dict) or any(key not in block for key in CORE_KEYS):
        got = (
            f"a mapping without {', '.join(k for k in CORE_KEYS if k not in block)}"
            if isinstance(block, dict)
            else type(block).__name__
        )
        raise ValueError(
            f"{where}/config.json: the 'posswap' block must be a mapping with {', '.join(CORE_KEYS)} "
            f"(as posswap.patch writes it); got {got}. Re-save the model with posswap, or delete the block to load it unpatched."
        )
    method = block["method"]
    if method not in _KEYS:
        raise _fail(where, f"has method {method!r}; posswap's methods are {', '.join(METHODS)}")
    keys = {**_COMMON, **_KEYS[method]}
    unknown = sorted(set(block) - set(keys) - {"method"})
    if unknown:
        raise _fail(
            where,
            f"({method}) has unknown key(s) {', '.join(map(repr, unknown))}; its keys are {', '.join(sorted(keys))}",
        )
    for key, (required, check) in keys.items():
        if key not in block:
            if required:
                raise _fail(where, f"({method}) has no {key!r}, which the {method} run time needs")
            continue
        problem = check(block[key], block)
        if problem:
            raise _fail(where, f"({method}) key {key!r} {problem}; got {block[key]!r}")
    if config is not None:
        _check_length(block, where, config)


def _check_length(block: dict, where: str, config: Any) -> None:
    arch = ARCHITECTURES.get(getattr(config, "model_type", None))
    rows = getattr(config, "max_position_embeddings", None)
    if arch is None or not isinstance(rows, int):
        return
    offset = arch.offset(config)
    if block["max_length"] + offset != rows:
        name = "n_positions" if arch.model_type == "gpt2" else "max_position_embeddings"
        padding = f" + {offset} padding rows" if offset else ""
        raise _fail(
            where,
            f"({block['method']}) key 'max_length' is {block['max_length']} but config.json's {name} is {rows} (it must be max_length{padding}): "
            "one of them was edited, and the model would read positions differently from how it was saved",
        )


def describe(config: Any) -> str:
    """The folder a config was read from, for messages (what ``from_pretrained`` was given)."""
    return str(getattr(config, "name_or_path", "") or getattr(config, "_name_or_path", "") or "<config>").rstrip("/")


def weights_mismatch(model_class: type, name_or_path: str, kwargs: dict) -> str | None:
    """Why transformers refused to load ``name_or_path`` for a size mismatch, in one line naming the tensor and
    the key of the posswap block that sizes it (None when no mismatch is found, e.g. nothing can be read)."""
    import json

    import torch
    from safetensors import safe_open
    from transformers import PretrainedConfig
    from transformers.utils import cached_file

    hub = {k: kwargs[k] for k in ("revision", "token", "cache_dir", "local_files_only", "subfolder") if k in kwargs}
    try:
        config = kwargs.get("config")
        if not isinstance(config, PretrainedConfig):
            config = model_class.config_class.from_pretrained(name_or_path, **hub)
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in model_class(config).state_dict().items()}
        index = cached_file(
            name_or_path, "model.safetensors.index.json", _raise_exceptions_for_missing_entries=False, **hub
        )
        files = sorted(set(json.loads(open(index).read())["weight_map"].values())) if index else ["model.safetensors"]
        saved = {}
        for name in files:
            with safe_open(cached_file(name_or_path, name, **hub), "pt") as f:
                saved.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})
    except (OSError, ValueError, KeyError, RuntimeError):
        return None
    block = getattr(config, "posswap", None) or {}
    for key, shape in saved.items():
        if key in expected and expected[key] != shape:
            sized_by = "num_buckets" if "relative_attention_bias" in key else "max_length"
            return (
                f"{str(name_or_path).rstrip('/')}/config.json: the 'posswap' block ({block.get('method')}) does not match "
                f"the weights: {key} is {list(shape)} in the checkpoint, but the block's {sized_by!r} "
                f"({block.get(sized_by)}) builds {list(expected[key])}. Put back the value posswap.patch wrote, or "
                "re-save the model with posswap."
            )
    return None
