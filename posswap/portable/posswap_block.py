"""The ``posswap`` block of a config.json, checked before anything is built from it.

A block that ``posswap.patch`` wrote always passes. A hand-edited one (a key removed, ``"128"`` for 128, 3.5
buckets, a length that no longer matches the model's) is refused with one line that names the folder, the block
and the key, instead of a KeyError or a ZeroDivisionError from inside the run time, or a model that loads and
gives other logits. Used by the classes of saved models (before they install anything) and by
``posswap.from_pretrained``.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from typing import Any

from .posswap_architectures import ARCHITECTURES
from .posswap_methods import EVERY_INSTALLER  # noqa: F401  (every method's block checks, registered as it loads)
from .posswap_registry import SCHEMAS
from .posswap_rules import block_problem, integer, text

CORE_KEYS = ("method", "max_length", "original_length")
# Keys of every method's block besides ``method``; the methods' own keys are in posswap_registry.SCHEMAS.
COMMON_KEYS = {
    "max_length": integer(1, required=True),
    "original_length": integer(1, required=True),
    "version": text(),
}


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


class CheckedBlock(dict):
    """A block that passed :func:`check_block`, and what it was then: while it is unchanged, its rules are not run
    again (a folder loads through a loader, a model class and the run time, which each need a checked block)."""

    def __init__(self, block: dict):
        super().__init__(block)
        self.checked_as = dict(block)

    def unchanged(self) -> bool:
        return dict(self) == self.checked_as


def checked_block(block: Any, where: str, config: Any = None) -> Any:
    """``block`` migrated and checked (:func:`check_block`), as a :class:`CheckedBlock`; one already checked and
    unchanged has only its length compared with ``config`` (the config may be another one)."""
    block = migrate_block(block)  # a folder saved by an older posswap: its keys under their current names
    if isinstance(block, CheckedBlock) and block.unchanged():
        if config is not None:
            _check_length(block, where, config)
        return block
    check_block(block, where, config)
    return CheckedBlock(block) if isinstance(block, dict) else block


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
    _check_rules(block, where)
    if config is not None:
        _check_length(block, where, config)


def _check_rules(block: dict, where: str) -> None:
    """The method known, no unknown key, each key's rule (the schema): the part a checked block skips."""
    method = block["method"]
    if method not in SCHEMAS:
        raise ValueError(
            f"{where}/config.json: the 'posswap' block has method {method!r}, which this code does not know (its "
            f"methods: {', '.join(SCHEMAS)}). A method registered outside posswap is carried in saved folders only "
            "with its run-time file (register_method(..., runtime_module=path)): load the folder with "
            "posswap.from_pretrained where that method is registered, or register it so and save the model again."
        )
    keys = {**COMMON_KEYS, **SCHEMAS[method]}
    unknown = sorted(set(block) - set(keys) - {"method"})
    if unknown:
        raise _fail(
            where,
            f"({method}) has unknown key(s) {', '.join(map(repr, unknown))}; its keys are {', '.join(sorted(keys))}",
        )
    for key, rule in keys.items():
        if key not in block:
            if rule.get("required"):
                raise _fail(where, f"({method}) has no {key!r}, which the {method} run time needs")
            continue
        problem = block_problem(block[key], rule, block)
        if problem:
            raise _fail(where, f"({method}) key {key!r} {problem}; got {block[key]!r}")


def _check_length(block: dict, where: str, config: Any) -> None:
    arch = ARCHITECTURES.get(getattr(config, "model_type", None))
    rows = getattr(config, "max_position_embeddings", None)
    if arch is None or not isinstance(rows, int):
        return
    offset = arch.offset(config)
    if block["max_length"] + offset != rows:
        name = arch.size_name
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
