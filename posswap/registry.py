"""Method name -> (config class, apply function): the one table every entry point looks methods up in."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_class: type
    # check(model, sites, config): raise before anything changes; apply(...): mutate the model.
    check: Callable[..., None]
    apply: Callable[..., None]


METHODS: dict[str, MethodSpec] = {}


def register_method(config_class: type, check: Callable, apply: Callable) -> None:
    name = config_class.method
    if name in METHODS:
        raise ValueError(f"Method {name!r} is already registered.")
    METHODS[name] = MethodSpec(name, config_class, check, apply)


def get_method(name: str | None) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"Unknown posswap method {name!r}; choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]
