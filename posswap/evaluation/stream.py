"""Text -> one token stream -> windows, under a token budget, and the context limit of a model."""

from __future__ import annotations

import torch
from torch import nn

from ..portable.posswap_architectures import find_sites


def token_stream(texts, tokenizer, max_tokens: int, min_tokens: int | None = None) -> torch.Tensor:
    """Token ids of ``texts`` joined (with EOS between documents when the tokenizer has one), stopping once
    ``max_tokens`` are there: novels are long, and tokenising only what the budget needs keeps runs short.
    Fewer than ``min_tokens`` (default ``max_tokens``) is an error."""
    min_tokens = max_tokens if min_tokens is None else min_tokens
    separator = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids: list[int] = []
    for text in texts:
        # verbose=False: a whole novel is longer than model_max_length on purpose; windows are cut later.
        ids += tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"] + separator
        if len(ids) >= max_tokens:
            break
    if len(ids) < min_tokens:
        raise ValueError(
            f"The data gives {len(ids)} tokens, fewer than the {min_tokens} needed for the longest length; "
            "use shorter --lengths or more text."
        )
    return torch.tensor(ids[:max_tokens], dtype=torch.long)


def windows(stream: torch.Tensor, length: int, max_tokens: int) -> list[torch.Tensor]:
    """Non-overlapping windows of ``length`` tokens from the start of ``stream``: ``max_tokens // length``
    of them, at least one, so every length reads the same text from the same place."""
    if length < 2:
        raise ValueError(f"Lengths must be at least 2 tokens; got {length}.")
    count = max(1, min(max_tokens // length, len(stream) // length))
    return [stream[i * length : (i + 1) * length] for i in range(count)]


def context_limit(model: nn.Module) -> int | None:
    """Tokens the model reads (after RoBERTa's padding offset), or None for a model without a limit."""
    try:
        return find_sites(model).max_length
    except ValueError:
        # Not a posswap architecture (e.g. a stub in a test): fall back to the config, if any.
        config = getattr(model, "config", None)
        return getattr(config, "max_position_embeddings", None)


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch.device: None is cuda when there is a GPU, else cpu. One this machine cannot use
    (a typo, ``cuda`` without a GPU, ``cuda:3`` with one) is a ValueError now, not a failure mid-evaluation."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
        torch.empty(0, device=resolved)  # the only reliable check that the device exists here
    except (RuntimeError, AssertionError, TypeError) as error:
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"device {str(device)!r} cannot be used here ({first_line}); use cpu, cuda or cuda:N."
        ) from None
    return resolved


def model_device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")
