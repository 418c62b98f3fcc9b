"""What ``posswap patch`` checks about a model before any work: that ``--max-length`` does not shrink it unless
``--allow-shrink`` says so (one line, exit 2). That a bare name is found at all is :mod:`posswap.cli.model_sources`'s."""

from __future__ import annotations


def model_length(source: str) -> int | None:
    """Tokens the model at ``source`` reads now, from its config alone; None for a model type posswap does not
    patch (``patch`` names it)."""
    from transformers import AutoConfig

    from ..portable.modeling_posswap import MODEL_TYPE_PREFIX
    from ..portable.posswap_architectures import ARCHITECTURES
    from ..sentence_models import transformer_folder

    config = AutoConfig.from_pretrained(source, subfolder=transformer_folder(source) or "")
    arch = ARCHITECTURES.get(str(getattr(config, "model_type", "")).removeprefix(MODEL_TYPE_PREFIX))
    if arch is None or getattr(config, "max_position_embeddings", None) is None:
        return None
    return config.max_position_embeddings - arch.offset(config)


def check_no_shrink(source: str, max_length: int, allow_shrink: bool) -> int | None:
    """A ``--max-length`` below the model's own length, refused as ``posswap.patch`` refuses it, before the model
    loads. Returns the model's own length (None where posswap does not know the model type)."""
    from ..patching import check_no_shrink as refuse_shrink

    own = model_length(source)
    refuse_shrink(max_length, own, allow_shrink, ("--max-length", "add --allow-shrink"))
    return own
