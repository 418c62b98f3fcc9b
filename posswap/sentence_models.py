"""sentence-transformers models as posswap models: patch, save, load and push them as sentence-transformers models.

A ``SentenceTransformer`` is a sequence of modules; its first sentence-transformers ``Transformer`` module holds
the transformers model (``auto_model``) and the tokenizer. :func:`posswap.patch` patches that model as it
patches any other, then sets the module's ``max_seq_length`` and the tokenizer's ``model_max_length`` to the
new length (the usable length: RoBERTa's padding offset is in ``max_position_embeddings``, not here).

Saving needs nothing more: sentence-transformers writes its transformer with ``save_pretrained``, so that
folder's config.json carries the posswap block and, for a method with run-time code, posswap's ``model_type``,
``auto_map`` and code files beside the weights (``posswap/portable``). ``SentenceTransformer(folder,
trust_remote_code=True)`` loads the transformer through transformers' Auto classes and so runs that code;
without ``trust_remote_code`` transformers refuses it. An ``interpolate`` folder is a stock one of a new size.

sentence-transformers is an optional extra (``posswap[st]``): nothing here imports it until a
sentence-transformers model or folder is in hand.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from .extras import MissingExtra, install_command
from .portable.posswap_guard import LengthGuard
from .portable.posswap_hooks import find_hooks
from .portable.posswap_placement import ShortInputPositions
from .portable.posswap_runtime import needs_runtime_code

INSTALL = install_command("st")
# Keywords of posswap.from_pretrained that locate files; the transformer inside the folder is read with them too.
SENTENCE_HUB_KWARGS = ("revision", "token", "local_files_only")


def is_sentence_transformer(obj: Any) -> bool:
    """A sentence-transformers model (or one of its modules), told without importing sentence-transformers."""
    return isinstance(obj, nn.Module) and "sentence_transformers" in sys.modules and _from_package(type(obj))


def _from_package(cls: type, name: str | None = None) -> bool:
    return any(c.__module__.startswith("sentence_transformers.") and name in (None, c.__name__) for c in cls.__mro__)


def transformer_module(model: nn.Module) -> nn.Module:
    """The first sentence-transformers ``Transformer`` module of ``model`` (``model[0]`` in the usual layout)."""
    for module in model.modules():
        if _from_package(type(module), "Transformer"):
            return module
    found = ", ".join(type(m).__name__ for m in model.children()) or "none"
    raise ValueError(
        f"This {type(model).__name__} has no sentence-transformers Transformer module (its modules: {found}); "
        "posswap patches the transformers model that such a module holds."
    )


class GuardFeatures:
    """Forward pre-hook on a sentence-transformers ``Transformer`` module: sentence-transformers 6 calls its
    transformers model's ``forward`` itself, past the model's hooks, so a stock class patched in memory (whose
    ``forward`` posswap does not own) would read any length with no word, and short inputs of an
    ``exact_short_inputs`` model would read the wrong rows. This runs those hooks on the features first: the
    position ids go into the features, the length guard checks them. An object, not a closure: deepcopy and
    pickling carry it."""

    def __call__(self, module: nn.Module, args: tuple):
        base = module.auto_model
        if getattr(type(base).forward, "runs_hooks", False):  # posswap's class: its forward runs its hooks itself
            return None
        features = args[0] if args and isinstance(args[0], Mapping) else None  # a dict, or a BatchEncoding
        if features is None:
            return None
        for placement in find_hooks(base, ShortInputPositions):
            ids = placement.position_ids(base, features)
            if ids is not None:
                features = {**features, "position_ids": ids}
        inputs = {k: features[k] for k in ("input_ids", "inputs_embeds", "position_ids") if k in features}
        for guard in find_hooks(base, LengthGuard):
            guard(base, (), inputs)
        return (features, *args[1:]) if features is not args[0] else None


def guard_transformer_module(module: nn.Module) -> None:
    """Idempotent: one :class:`GuardFeatures` per module."""
    if not find_hooks(module, GuardFeatures):
        module.register_forward_pre_hook(GuardFeatures())


def adopt_patch(model: nn.Module, block: dict) -> None:
    """After :func:`posswap.patch` patched the transformer of sentence-transformers ``model`` (``block``: its
    posswap block): ``max_seq_length`` and the tokenizer's ``model_max_length`` become the new length, the
    length is guarded where sentence-transformers feeds the transformer, and the model card is tagged."""
    module = transformer_module(model)
    own_tokenizer = getattr(module, "tokenizer", None)
    guard_transformer_module(module)
    module.max_seq_length = block["max_length"]  # sentence-transformers 6: the tokenizer's limit; 5: its own setting
    if own_tokenizer is not None:
        own_tokenizer.model_max_length = block["max_length"]
    # The card read from the source folder describes the unpatched model (its length among others): saving
    # writes a new one, tagged.
    if getattr(model, "_model_card_text", None):
        model._model_card_text = None
    card_data = getattr(model, "model_card_data", None)
    if card_data is not None and hasattr(card_data, "add_tags"):
        card_data.add_tags(["posswap", block["method"]])


def transformer_folder(name_or_path: str, kwargs: dict | None = None) -> str | None:
    """Where the transformer of a sentence-transformers model is, relative to its folder or repo (``""``: the
    root, as sentence-transformers writes it); None when ``name_or_path`` is not a sentence-transformers model."""
    modules = read_json(name_or_path, "modules.json", kwargs or {})
    if not isinstance(modules, list):
        return None
    for entry in modules:
        if isinstance(entry, dict) and str(entry.get("type", "")).rsplit(".", 1)[-1] == "Transformer":
            return str(entry.get("path") or "")
    return None


def read_json(name_or_path: str, filename: str, kwargs: dict) -> Any:
    if os.path.isdir(name_or_path):
        path = Path(name_or_path) / filename
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    from transformers.utils import cached_file

    try:
        path = cached_file(
            name_or_path,
            filename,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            cache_dir=kwargs.get("cache_folder") or kwargs.get("cache_dir"),
            **{k: kwargs[k] for k in SENTENCE_HUB_KWARGS if k in kwargs},
        )
    except OSError:  # no such repo: the caller's own loading says so in its words
        return None
    return None if path is None else json.loads(Path(path).read_text(encoding="utf-8"))


def import_sentence_transformers(what: str):
    try:
        import sentence_transformers
    except ImportError as error:
        raise MissingExtra(
            f"{what} is a sentence-transformers model, and sentence-transformers is not installed: {INSTALL}. "
            "(To load only its transformer, pass model_class=AutoModel or the class you need.)"
        ) from error
    return sentence_transformers


def check_modules(name_or_path: str, subfolder: str, config: Any, kwargs: dict) -> None:
    """The pooling modules that modules.json lists have their config, of the transformer's width: sentence-transformers
    itself would fail naming no file (a missing one) or load with no word (a width that disagrees)."""
    width = config.get("hidden_size", config.get("n_embd", config.get("d_model"))) if isinstance(config, dict) else None
    for entry in read_json(name_or_path, "modules.json", kwargs) or []:
        if not (isinstance(entry, dict) and str(entry.get("type", "")).endswith(".Pooling")):
            continue
        path = str(Path(str(entry.get("path") or "")) / "config.json")
        pooling = read_json(name_or_path, path, kwargs)
        if not isinstance(pooling, dict):
            raise ValueError(
                f"{name_or_path}: {path} is missing, and modules.json lists a Pooling module there: put back the file "
                "sentence-transformers wrote (embedding_dimension, pooling_mode), or drop the module from modules.json."
            )
        dimension = pooling.get("embedding_dimension", pooling.get("word_embedding_dimension"))
        if width is not None and dimension != width:
            raise ValueError(
                f"{name_or_path}: {path} says embedding_dimension {dimension} but the transformer ({subfolder or '.'}"
                f"/config.json) gives vectors of {width}: set it to {width}."
            )


def check_max_seq_length(name_or_path: str, subfolder: str, block: dict, kwargs: dict) -> None:
    """sentence-transformers truncates at sentence_bert_config.json's max_seq_length, not at the model's limit: one
    above the posswap block's max_length would hand the model inputs it does not read."""
    path = str(Path(subfolder) / "sentence_bert_config.json")
    length = (read_json(name_or_path, path, kwargs) or {}).get("max_seq_length")
    limit = block.get("max_length")
    if isinstance(length, int) and isinstance(limit, int) and length > limit:
        raise ValueError(
            f"{name_or_path}: {path} says max_seq_length {length} but this model reads at most {limit} tokens (its "
            f"posswap block's max_length): set max_seq_length to {limit} or less."
        )


def model_class_of(st, name_or_path: str, kwargs: dict) -> type:
    """The class config_sentence_transformers.json names (SentenceTransformer when it names none, as
    sentence-transformers itself reads it)."""
    config = read_json(name_or_path, "config_sentence_transformers.json", kwargs) or {}
    name = config.get("model_type", "SentenceTransformer") if isinstance(config, dict) else "SentenceTransformer"
    cls = getattr(st, str(name), None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ValueError(
            f"{name_or_path}: config_sentence_transformers.json names model_type {name!r}, which this "
            f"sentence-transformers ({st.__version__}) does not have."
        )
    return cls


def replace_transformer(module: nn.Module, model: nn.Module) -> None:
    """Put ``model`` where ``module`` keeps its transformers model, on the same device and with the cache
    setting sentence-transformers chose."""
    old = module.auto_model
    attribute = next(name for name, child in module.named_children() if child is old)  # "model" (6.x) or "auto_model"
    if getattr(model, "hf_device_map", None) is None:
        model.to(next(old.parameters()).device)
    if hasattr(old.config, "use_cache"):
        model.config.use_cache = old.config.use_cache
    model.train(old.training)
    setattr(module, attribute, model)
    guard_transformer_module(module)


def save(model: nn.Module, folder: str | os.PathLike, card: bool = True) -> None:
    """``save_pretrained`` for a transformers model or a sentence-transformers one (``card=False``: without
    sentence-transformers' model card, for a caller that writes its own)."""
    if is_sentence_transformer(model):
        model.save(str(folder), create_model_card=card)
    else:
        model.save_pretrained(folder)


@dataclass(frozen=True)
class CardLoader:
    """How a model card says to load a patched folder: the library, and its import and call (``{repo}`` in a call
    is the repo id), for a folder it loads alone and for one that carries posswap's code."""

    posswap_note: str  # after "With posswap"
    alone: str  # what loads a folder whose table only changed size
    plain_import: str
    plain_call: str
    library: str  # what loads a folder that carries posswap's code, with trust_remote_code
    refused: str  # what happens without trust_remote_code
    remote_import: str
    remote_call: str


SENTENCE_TRANSFORMERS = CardLoader(
    posswap_note=" (a `SentenceTransformer`, patched)",
    alone="sentence-transformers alone",
    plain_import="from sentence_transformers import SentenceTransformer",
    plain_call="SentenceTransformer({repo})",
    library="sentence-transformers",
    refused="loading is refused",
    remote_import="from sentence_transformers import SentenceTransformer",
    remote_call="SentenceTransformer({repo}, trust_remote_code=True)",
)


def loading_lines(block: dict, repo: str, loader: CardLoader = SENTENCE_TRANSFORMERS) -> list[str]:
    """The model card's "How to load it" for a model patched as ``block`` says: with posswap, then with ``loader``'s
    library alone (the card text of every patched folder, transformers' or sentence-transformers')."""

    def code(imported: str, call: str) -> list[str]:
        return ["```python", imported, "", "model = " + call.replace("{repo}", repo), "```", ""]

    lines = [
        "## How to load it",
        "",
        f"With posswap{loader.posswap_note}:",
        "",
        *code("import posswap", "posswap.from_pretrained({repo})"),
    ]
    if not needs_runtime_code(block):
        lines += [f"Only the size of the position table changed, so {loader.alone} loads it too:", ""]
        return lines + code(loader.plain_import, loader.plain_call)
    lines += [
        f"Without posswap: this repo carries the code of its {block['method']} positions (`modeling_posswap.py`), so",
        f"{loader.library} loads it with `trust_remote_code=True` (without it, {loader.refused}):",
        "",
    ]
    return lines + code(loader.remote_import, loader.remote_call)
