"""Causal-LM loss per token, non-overlapping or with the sliding window of the transformers perplexity guide
(https://huggingface.co/docs/transformers/perplexity), and what to do past the model's own limit."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .stream import model_device

BEYOND = ("truncate", "sliding")


@dataclass
class TokenLosses:
    """Loss of every predicted token, its index in the sequence scored, and in the forward pass that scored it."""

    nll: torch.Tensor  # (n,) float
    position: torch.Tensor  # (n,) long: index in the ids given
    context: torch.Tensor  # (n,) long: index in its forward pass (the tokens it could see)

    @staticmethod
    def cat(parts: list[TokenLosses]) -> TokenLosses:
        return TokenLosses(*(torch.cat([getattr(p, f) for p in parts]) for f in ("nll", "position", "context")))

    def mean(self) -> float:
        return self.nll.mean().item()


@torch.no_grad()
def sliding_losses(model: nn.Module, ids: torch.Tensor, window: int, stride: int) -> TokenLosses:
    """The perplexity guide's loop over the 1-D ``ids``: forward passes of at most ``window`` tokens that
    start ``stride`` apart; each scores only the tokens the previous pass did not (labels -100 for the
    context part). ``stride == window`` is plain non-overlapping windows; the first token is never scored."""
    if not 0 < stride <= window:
        raise ValueError(f"stride must be between 1 and the window ({window}); got {stride}.")
    device = model_device(model)
    parts, previous_end = [], 0
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        target_length = end - previous_end  # may be < stride on the last pass
        input_ids = ids[begin:end].unsqueeze(0).to(device)
        logits = model(input_ids=input_ids).logits[0, :-1].float()
        nll = F.cross_entropy(logits, input_ids[0, 1:], reduction="none")
        first = max(1, input_ids.shape[1] - target_length)  # labels before this are the -100 context
        context = torch.arange(first, input_ids.shape[1])
        parts.append(TokenLosses(nll[first - 1 :].cpu(), context + begin, context))
        previous_end = end
        if end == len(ids):
            break
    return TokenLosses.cat(parts)


def window_losses(
    model: nn.Module, window: torch.Tensor, limit: int | None, beyond: str, stride: int | None
) -> tuple[TokenLosses, str]:
    """Losses of one requested-length window and how it was read: ``full`` (one pass), ``truncate`` (passes of
    the model's own length, each from a fresh start) or ``sliding`` (the model's length, ``stride`` apart;
    default half of it)."""
    if beyond not in BEYOND:
        raise ValueError(f"beyond must be one of {', '.join(BEYOND)}; got {beyond!r}.")
    length = len(window)
    if limit is None or length <= limit:
        return sliding_losses(model, window, length, length), "full"
    if beyond == "truncate":
        return sliding_losses(model, window, limit, limit), "truncate"
    return sliding_losses(model, window, limit, min(stride or limit // 2, limit)), "sliding"
