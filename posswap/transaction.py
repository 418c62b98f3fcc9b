"""All-or-nothing changes to a model: :func:`model_transaction` records the state of every module and of the
config, and puts it back if the block raises (a failure inside a method's apply, an allocation, transformers
refusing a kernel).

It records containers, not tensor contents: code inside the block must replace parameters, buffers, modules
and hooks (as posswap's methods do), never modify a tensor in place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

# Per-module containers that patching may change; dict copies are cheap (references only).
_MODULE_DICTS = (
    "_parameters",
    "_buffers",
    "_modules",
    "_non_persistent_buffers_set",
    "_forward_pre_hooks",
    "_forward_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
)


def _module_state(module: nn.Module) -> dict:
    state = {name: getattr(module, name).copy() for name in _MODULE_DICTS if hasattr(module, name)}
    return {"dicts": state, "attributes": dict(module.__dict__)}


def _restore_module(module: nn.Module, state: dict) -> None:
    for key in set(module.__dict__) - set(state["attributes"]):
        del module.__dict__[key]  # attributes the block added (posswap_rotary, posswap_bias, ...)
    module.__dict__.update(state["attributes"])
    for name, saved in state["dicts"].items():
        container = getattr(module, name)
        container.clear()
        container.update(saved)


@contextlib.contextmanager
def model_transaction(model: nn.Module) -> Iterator[None]:
    modules = list(model.modules())
    saved = [(m, _module_state(m)) for m in modules]
    config = model.config
    config_class, config_state = type(config), dict(config.__dict__)
    try:
        yield
    except BaseException:
        for module, state in saved:
            _restore_module(module, state)
        config.__class__ = config_class
        config.__dict__.clear()
        config.__dict__.update(config_state)
        raise
