"""The per-call state of a patched model: what one forward computes once and its layers share (RoPE's cos/sin,
the bias with its mask, TUPE's features), kept to that forward.

A forward pre-hook on the base model (:class:`StartCall`) puts a fresh :class:`CallState` into the keyword
arguments of each call; transformers hands those kwargs down through every layer to the attention module and
its attention function (``**kwargs``), so each layer finds the state of its own call there. Nothing is written
to a module: a model served from several threads gives every call the output it gives alone, and the state
dies with the call (nothing to clear). The hook is an object, not a closure: ``copy.deepcopy``, pickling and
DataParallel replicas carry their own.

Under gradient checkpointing (training), every layer builds its state itself: a checkpointed layer is run again
in the backward pass and must do there what it did in the forward (the same ops, with gradients to the
provider's parameters), which a value built by another layer, or by this layer's first run, would not.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .posswap_hooks import find_hooks, passed_cache

# The keyword argument that carries the state from the base model down to the attention functions.
STATE_KWARG = "posswap_call"


def _same(a: Any, b: Any) -> bool:
    # Tensors by identity: the entry holds them, so an id cannot be reused while the entry lives.
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) or a is None or b is None:
        return a is b
    return a == b


class CallState:
    """Values built once in one forward and shared by its layers: one entry per (owner, kind), rebuilt when the
    layer's inputs (``key``: tensors by identity) are not those it was built from.

    ``cache``: the KV cache this call was given (None: none, or one the model makes itself); ``key_positions``:
    the positions of every key this call's bias attended to, (batch or 1, keys), recorded by the bias attention
    and kept on the returned cache (``KEY_POSITIONS``) for the next call (see ``posswap_attention.bias_positions``).
    """

    __slots__ = ("share", "entries", "cache", "key_positions")

    def __init__(self, share: bool = True, cache: Any = None):
        self.share = share  # False under gradient checkpointing: every layer builds its own
        self.entries: dict[Any, tuple] = {}
        self.cache, self.key_positions = cache, None

    def get(self, owner: Any, key: tuple, build: Callable[[], Any]) -> Any:
        if not self.share:
            return build()
        entry = self.entries.get(owner)
        if entry is None or len(entry[0]) != len(key) or not all(map(_same, entry[0], key)):
            entry = self.entries[owner] = (key, build())
        return entry[1]


def shared(kwargs: dict, owner: Any, key: tuple, build: Callable[[], Any]) -> Any:
    """``build()`` once per call for ``owner`` (the call's state in ``kwargs``); built each time without one (a
    layer or an attention function called directly)."""
    state = kwargs.get(STATE_KWARG)
    return build() if state is None else state.get(owner, key, build)


def _checkpointing(base: nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in base.modules())


class StartCall:
    """Forward pre-hook on the base model: a fresh :class:`CallState` for each call, in its kwargs."""

    def __call__(self, base: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        share = not (base.training and torch.is_grad_enabled() and _checkpointing(base))
        # The heads pass the cache by keyword; one passed by position is not seen (its keys' positions then count
        # as unknown: see posswap_attention.bias_positions).
        return args, {**kwargs, STATE_KWARG: CallState(share, passed_cache(kwargs))}


def install_call_state(base: nn.Module) -> None:
    """Idempotent. A base model whose forward takes no ``**kwargs`` gets no state (its layers then build their
    values each time): correct, only slower."""
    if find_hooks(base, StartCall):
        return
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(type(base).forward).parameters.values())
    if takes_kwargs:
        base.register_forward_pre_hook(StartCall(), with_kwargs=True)


def forward_through_hooks(stock_forward: Callable) -> Callable:
    """A model class's ``forward`` that runs the base model's hooks (the length guard, this call's state) when a
    caller calls ``forward`` itself rather than the model: sentence-transformers 6 does
    (``self.model.forward(**features)``), and so does peft's LoraModel on a base model. Without this, an input longer
    than the model reads would run with no word. A call through ``__call__`` carries the state its StartCall hook
    added and goes straight to the stock forward. ``functools.wraps``: transformers, the Trainer and
    sentence-transformers read the stock signature through it."""

    @functools.wraps(stock_forward)
    def forward(self, *args, **kwargs):
        if STATE_KWARG not in kwargs and find_hooks(self, StartCall):
            return self(*args, **kwargs)
        return stock_forward(self, *args, **kwargs)

    forward.runs_hooks = True  # read by sentence_models.GuardFeatures: such a class guards itself
    return forward
