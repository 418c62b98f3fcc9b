"""``posswap.patch``: check everything, then change the model in place."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import nn

from .config import PositionConfig, check_flags, config_from_dict
from .memory import check_patch_fits
from .portable.modeling_posswap import CONFIG_CLASSES
from .portable.posswap_architectures import (
    assign_buffers,
    find_stacks,
    resized_attention_buffers,
    resized_position_buffers,
)
from .portable.posswap_block import CheckedBlock
from .portable.posswap_runtime import install_positions, needs_runtime_code
from .registry import get_method
from .sentence_models import adopt_patch, is_sentence_transformer, transformer_module
from .transaction import model_transaction
from .version import __version__

# Key of the block that save_pretrained writes into config.json.
CONFIG_KEY = "posswap"


def patch(
    model: nn.Module, config: PositionConfig | dict[str, Any], tokenizer: Any = None, *, allow_shrink: bool = False
) -> nn.Module:
    """Swap the position handling of ``model`` for ``config``'s method; returns the same model object.

    The model keeps its class (``GPT2LMHeadModel`` stays one). Its ``config.max_position_embeddings``
    becomes the new length (plus RoBERTa's padding offset), and a ``posswap`` block is added to its config
    so that ``save_pretrained`` / :func:`posswap.from_pretrained` round-trip. If ``tokenizer`` is given,
    its ``model_max_length`` is set to the new length. On any error the model is left untouched.

    A ``max_length`` below the tokens the model reads now would lose the positions past it: refused unless
    ``allow_shrink=True`` (as ``posswap patch --allow-shrink``).

    A sentence-transformers model (``SentenceTransformer``) is patched through its transformer, and its
    ``max_seq_length`` and tokenizer limit become the new length; it is returned too.
    """
    check_flags(allow_shrink=allow_shrink)  # "no" is a true string: it would shrink the table
    if is_sentence_transformer(model):  # its transformer, then the length where sentence-transformers reads it
        inner = transformer_module(model).auto_model
        patch(inner, config, tokenizer=tokenizer, allow_shrink=allow_shrink)  # raises before changing anything
        adopt_patch(model, getattr(inner.config, CONFIG_KEY))
        return model
    config = _checked_copy(config)
    spec = get_method(config.method)
    stacks = find_stacks(model)
    sites = stacks[0]
    check_no_shrink(config.max_length, sites.max_length, allow_shrink)
    previous = getattr(model.config, CONFIG_KEY, None)
    _check_same_method(previous, config.method)
    if tokenizer is not None and not hasattr(tokenizer, "model_max_length"):
        raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}.")
    for each in stacks:
        spec.check(model, each, config)
    check_patch_fits(model, config, sites, len(stacks))  # before any position-sized tensor is allocated

    # Everything below changes the model; allocations come first, and any failure puts everything back.
    rows = config.max_length + sites.offset
    buffers = [(each, resized_position_buffers(each, rows), resized_attention_buffers(each, rows)) for each in stacks]
    original_length = previous["original_length"] if previous else sites.max_length
    with model_transaction(model):
        applied = [spec.apply(model, each, config) for each in stacks]  # weights: the tables resized or kept
        _assign_all(buffers)
        model.config.max_position_embeddings = rows
        block = {**config.to_dict(), "original_length": original_length, "version": __version__}
        if isinstance(previous, CheckedBlock) and previous.unchanged() and previous == block:
            block = previous  # a loaded folder patched again as it was saved: its block is checked already
        setattr(model.config, CONFIG_KEY, block)
        if needs_runtime_code(block):
            # Saved, the folder says posswap-<type> and carries the code that runs the method (modeling_posswap).
            model.config.__class__ = CONFIG_CLASSES[sites.arch.model_type]
        install_positions(model, block, stacks)  # run time: what a saved model's own class installs when built
        if spec.initialize is not None:
            for each, result in zip(stacks, applied, strict=True):
                spec.initialize(model, each, config, result)
    if tokenizer is not None:
        tokenizer.model_max_length = config.max_length
    return model


def _check_same_method(previous: dict | None, method: str) -> None:
    if previous and previous["method"] != method:
        raise ValueError(
            f"This model is already patched with {previous['method']!r}; patching it again with "
            f"{method!r} is not supported. Start from the original checkpoint."
        )


def _assign_all(buffers: list) -> None:
    """Each stack's position-sized buffers on its embeddings, and its attention modules' (GPT-Neo's masks)."""
    for sites, owned, per_attention in buffers:
        assign_buffers(sites.owner, owned)
        for attention, values in per_attention:
            assign_buffers(attention, values)


def patched_config(model: nn.Module) -> PositionConfig | None:
    """The config a model was patched with, or None for a stock model."""
    block = getattr(getattr(model, "config", None), CONFIG_KEY, None)
    if not block:
        return None
    return config_from_dict({k: v for k, v in block.items() if k not in ("original_length", "version")})


def _checked_copy(config: PositionConfig | dict[str, Any]) -> PositionConfig:
    """``config`` (a dict made a config) validated, as a copy: methods may record resolved choices (ALiBi's backend)
    on it."""
    if isinstance(config, dict):
        config = config_from_dict(config)
    if not isinstance(config, PositionConfig):
        raise TypeError(
            f"config must be a posswap config (InterpolateConfig, ...) or a dict, got {type(config).__name__}."
        )
    config.validate()  # the dataclass may have been edited since it was built
    return dataclasses.replace(config)


def check_no_shrink(
    max_length: int,
    own: int | None,
    allow_shrink: bool,
    names: tuple[str, str] = ("max_length", "pass allow_shrink=True"),
) -> None:
    """A ``max_length`` below ``own`` (the tokens the model reads now; None: unknown) loses the positions past it:
    refused unless asked for. ``names``: how the caller spells the length and the permission (the CLI: its flags)."""
    if own is not None and max_length < own and not allow_shrink:
        length, allow = names
        raise ValueError(
            f"{length} {max_length} is below the {own} tokens this model reads: the patch would shrink it. "
            f"Give {length} {own} or more, or {allow} to shrink it."
        )
