"""Method name -> everything the rest of posswap needs of a method: the one table every entry point looks methods up in.

A method registers once, in its own file under ``posswap/methods``: its config class, its checks and weight changes,
and its study variants. The parts that live elsewhere are keyed by the same name, and ``tests/test_registry.py``
fails naming any that is missing: the run-time installer (``portable/posswap_runtime.INSTALLERS``, which saved
models carry, so it cannot import this table), the position map of the pictures (``study/pictures.POSITION_MAPS``)
and the test factory (``tests/test_common.FACTORIES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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
    # The study's variants of this method: variant name -> config keys besides method and max_length.
    variants: dict[str, dict] = field(default_factory=dict)
    # True: the model reads positions from its learned table extended to max_length (the study makes it for the
    # trained length); False: nothing bounds the reach (the study patches to twice the trained length).
    extends_table: bool = False


METHODS: dict[str, MethodSpec] = {}


def register_method(
    config_class: type,
    check: Callable,
    apply: Callable,
    initialize: Callable | None = None,
    *,
    variants: dict[str, dict],
    extends_table: bool = False,
) -> None:
    name = config_class.method
    if name in METHODS:
        raise ValueError(f"Method {name!r} is already registered.")
    taken = {v for spec in METHODS.values() for v in spec.variants} & set(variants)
    if not variants or taken:
        raise ValueError(
            f"Method {name!r} needs study variants of its own; got {sorted(variants)} ({sorted(taken)} taken)."
        )
    METHODS[name] = MethodSpec(name, config_class, check, apply, initialize, dict(variants), extends_table)


def get_method(name: str | None) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"Unknown posswap method {name!r}; choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


def study_variants() -> dict[str, tuple[MethodSpec, dict]]:
    """Every method's study variants in registration order: variant name -> (its method, its config keys)."""
    return {variant: (spec, keys) for spec in METHODS.values() for variant, keys in spec.variants.items()}
