"""Method name -> (config class, apply function): the one table every entry point looks methods up in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_class: type
    # check(model, sites, config): raise before anything changes; apply(...): the weight changes made before
    # the run time is installed (a resized table), returning anything initialize needs;
    # initialize(model, sites, config, applied): values for the parameters the run time created (its modules
    # are built empty, as when a saved model is built before its weights load).
    check: Callable[..., None]
    apply: Callable[..., object]
    initialize: Callable[..., None] | None = None


METHODS: dict[str, MethodSpec] = {}


def register_method(config_class: type, check: Callable, apply: Callable, initialize: Callable | None = None) -> None:
    name = config_class.method
    if name in METHODS:
        raise ValueError(f"Method {name!r} is already registered.")
    METHODS[name] = MethodSpec(name, config_class, check, apply, initialize)


def get_method(name: str | None) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"Unknown posswap method {name!r}; choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]
