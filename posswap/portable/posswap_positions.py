"""The caller's ``position_ids`` carried down to the attention modules of a base model that gives them to its
embeddings only (DistilBERT: ``Architecture.passes_position_ids``). RoPE, ALiBi and the other run-time methods
read positions from the attention's kwargs (``position_ids``), as BERT, ALBERT and GPT-2 hand them down; without
this, DistilBERT would run them with the default 0..n-1 whatever the caller gave (packing, PoSE).

A forward pre-hook on the base model puts the ids into the call's ``**kwargs`` under :data:`CARRY_KWARG` (the
base's own ``position_ids`` parameter would swallow them under their name), which the model hands through every
layer; a pre-hook on each self-attention module gives them back their name. Hooks are objects, not closures.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import inspect

from torch import nn

from .posswap_hooks import call_arguments, find_hooks

CARRY_KWARG = "posswap_position_ids"


class SendPositions:
    """Forward pre-hook on the base model: the caller's position_ids also in ``**kwargs``, under CARRY_KWARG."""

    def __init__(self, base: nn.Module):
        self.signature = inspect.signature(type(base).forward)

    def __call__(self, base: nn.Module, args: tuple, kwargs: dict):
        given = call_arguments(self.signature, base, args, kwargs).get("position_ids")
        return None if given is None else (args, {**kwargs, CARRY_KWARG: given})


class ReceivePositions:
    """Forward pre-hook on a self-attention module: the carried ids under their own name, ``position_ids``."""

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict):
        if CARRY_KWARG not in kwargs:
            return None
        rest = {name: value for name, value in kwargs.items() if name != CARRY_KWARG}
        return args, {**rest, "position_ids": kwargs[CARRY_KWARG]}


def install_position_carrier(base: nn.Module, attentions: list[nn.Module]) -> None:
    """Idempotent. Each attention's receiver runs first among its pre-hooks (RoPE's reads the ids)."""
    if not find_hooks(base, SendPositions):
        base.register_forward_pre_hook(SendPositions(base), with_kwargs=True)
    for attention in attentions:
        if not find_hooks(attention, ReceivePositions):
            attention.register_forward_pre_hook(ReceivePositions(), with_kwargs=True, prepend=True)
