"""Method name -> everything the rest of posswap needs of a method: the one table every entry point looks methods up in.

A method registers once, in its own file under ``posswap/methods``: its config class (whose field metadata holds
each option's help and rule), its checks and weight changes, its study variants, the position map of the pictures
and an example config (the factory the common tests run). Its run time registers on the portable side, in its
own ``portable/posswap_<name>.py`` (``posswap_registry.installer``; saved models carry it, so it cannot import
this table), imported by ``portable/posswap_methods.py``. ``tests/test_registry.py`` fails naming what is missing.
A method registered from outside posswap brings its run time as one file (``runtime_module``, see
``runtime_modules.py``), which its saved folders carry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .portable.posswap_registry import (
    BLOCK_CHECKS,
    CARRIED,
    INSTALLERS,
    KEEPS_TABLE,
    RUNTIME_CODE,
    SCHEMAS,
    carry,
    register_schema,
    unregister,
)
from .runtime_modules import forget_runtime_module, load_runtime_module, runtime_module_name


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
    # position_map(model, sites, positions) -> (matrix, description) or None: what the pictures draw of the
    # model's position representation (study/pictures.py).
    position_map: Callable | None = None
    # example(max_length) -> a config of this method: the one the common tests (tests/test_common.py) run.
    example: Callable[[int], object] | None = None
    # export_refusal(config) -> None where `posswap export` writes an exact native folder for a model patched
    # with this config, else why not; None (no function): no native architecture computes these positions.
    export_refusal: Callable[[object], str | None] | None = None
    # The module a method from outside posswap runs (register_method's runtime_module), which its folders carry.
    runtime_module: str | None = None


METHODS: dict[str, MethodSpec] = {}
# posswap's own methods: a package whose import registers each (its modules call register_method). It is found by
# name on the first look-up, as a plugin is: the registry sits below the methods and never imports them itself.
BUILT_IN = "posswap.methods"


def registered() -> dict[str, MethodSpec]:
    """Every registered method, posswap's own among them (imported on the first call)."""
    if BUILT_IN not in sys.modules:
        importlib.import_module(BUILT_IN)
    return METHODS


def method_schema(config_class: type) -> dict[str, dict]:
    """key -> rule of a config class's saved block: each field's rule less what only a config may hold."""
    schema = {}
    for f in dataclasses.fields(config_class):
        if "rule" in f.metadata:
            schema[f.name] = {k: v for k, v in f.metadata["rule"].items() if k != "before_apply"}
    return schema


def register_method(
    config_class: type,
    check: Callable,
    apply: Callable,
    initialize: Callable | None = None,
    *,
    variants: dict[str, dict],
    extends_table: bool = False,
    position_map: Callable | None = None,
    example: Callable[[int], object] | None = None,
    export_refusal: Callable | None = None,
    runtime_module: str | os.PathLike | None = None,
) -> MethodSpec:
    """Register a method (see docs/methods-internals.md). ``runtime_module``: for a method from outside posswap,
    the ``.py`` file of its run time (``runtime_modules.py``), loaded here and carried by its saved folders; without
    it, such a method's folders load with ``posswap.from_pretrained`` only."""
    functions = dict(
        check=check,
        apply=apply,
        initialize=initialize,
        position_map=position_map,
        example=example,
        export_refusal=export_refusal,
    )
    _check_arguments(config_class, functions, variants, extends_table)
    name = config_class.method
    _check_new(name, variants)
    with _undone_on_error(runtime_module_name(runtime_module) if runtime_module is not None else None):
        module = load_runtime_module(name, runtime_module) if runtime_module is not None else None
        schema = _saved_keys(name, config_class)
        if module is not None:
            carry(name, schema)
        elif name not in SCHEMAS:  # a method from outside posswap: its saved keys, from its config class
            register_schema(name, schema)
        spec = MethodSpec(
            name,
            config_class,
            check,
            apply,
            initialize,
            dict(variants),
            extends_table,
            position_map,
            example,
            export_refusal,
            module.__name__ if module is not None else None,
        )
        METHODS[name] = spec
    return spec


# Every table a registration may change: the methods, and what the portable side keeps of them.
_TABLES = (METHODS, INSTALLERS, RUNTIME_CODE, SCHEMAS, BLOCK_CHECKS, KEEPS_TABLE, CARRIED)


@contextlib.contextmanager
def _undone_on_error(module_name: str | None) -> Iterator[None]:
    """On any error inside (a refusal, a run-time module that fails or registers more than its method), every
    registry table as it was before, and ``module_name`` (the run-time module loaded) out of ``sys.modules``: a
    refused registration leaves nothing registered, whatever the module did before it was refused."""
    saved = [(table, table.copy()) for table in _TABLES]
    loaded = sys.modules.get(module_name) if module_name else None
    try:
        yield
    except BaseException:
        for table, before in saved:
            table.clear()
            table.update(before)
        if module_name:
            sys.modules.pop(module_name, None)
            if loaded is not None:
                sys.modules[module_name] = loaded
        raise


# register_method's function arguments: how each is called (for the message), and whether it may be None.
_FUNCTIONS = {
    "check": ("check(model, sites, config)", False),
    "apply": ("apply(model, sites, config)", False),
    "initialize": ("initialize(model, sites, config, applied)", True),
    "position_map": ("position_map(model, sites, positions)", True),
    "example": ("example(max_length)", True),
    "export_refusal": ("export_refusal(config)", True),
}


def _check_arguments(config_class: object, functions: dict, variants: object, extends_table: object) -> None:
    """Refuse what register_method cannot use, in one line naming the argument and what it takes, before anything is
    read from it (``dict`` as the config class was an AttributeError from inside)."""
    _check_config_class(config_class)
    for argument, function in functions.items():
        call, optional = _FUNCTIONS[argument]
        if not callable(function) and not (optional and function is None):
            kind = f"a function {call}{' or None' if optional else ''}"
            raise TypeError(f"{argument} must be {kind}; got {_kind(function)}.")
    if not (
        isinstance(variants, dict) and all(isinstance(k, str) and isinstance(v, dict) for k, v in variants.items())
    ):
        raise TypeError(f"variants must be a dict of study variant name -> dict of config keys; got {variants!r:.80}.")
    if not isinstance(extends_table, bool):
        raise ValueError(f"extends_table must be True or False, got {extends_table!r:.80}.")


def _check_config_class(config_class: object) -> None:
    """A dataclass deriving from ``posswap.PositionConfig`` (known by name: posswap.config sits beside this module and
    imports it), whose ``method`` names the method."""
    wanted = "config_class must be a dataclass subclass of posswap.PositionConfig"
    if not isinstance(config_class, type) or not any(
        f"{c.__module__}.{c.__qualname__}" == "posswap.config.PositionConfig" for c in config_class.__mro__
    ):
        raise TypeError(f"{wanted}; got {_kind(config_class)}.")
    fields = {f.name for f in dataclasses.fields(config_class)}
    own = inspect.get_annotations(config_class)  # the options it declares itself: fields only under @dataclass
    loose = [name for name, hint in own.items() if name not in fields and "ClassVar" not in str(hint)]
    if loose:
        raise TypeError(
            f"{wanted}; got {config_class.__name__}, whose options {', '.join(loose)} are not dataclass fields "
            "(decorate it with @dataclass)."
        )
    method = getattr(config_class, "method", None)
    if not isinstance(method, str) or not method:
        raise ValueError(
            f"config_class {config_class.__name__} must name its method (a class attribute method = 'my-method'); "
            f"got {method!r:.80}."
        )


def _kind(value: object) -> str:
    """What a wrong argument is, for a message: None, a class by its name, a plain value by its type, else "an
    instance of" its class."""
    if value is None:
        return "None"
    if isinstance(value, type):
        return value.__name__
    return type(value).__name__ if isinstance(value, (str, int, float)) else f"an instance of {type(value).__name__}"


def _check_new(name: str, variants: dict[str, dict]) -> None:
    if name in METHODS:
        raise ValueError(f"Method {name!r} is already registered.")
    taken = {v for spec in METHODS.values() for v in spec.variants} & set(variants)
    if not variants or taken:
        raise ValueError(
            f"Method {name!r} needs study variants of its own; got {sorted(variants)} ({sorted(taken)} taken)."
        )


def _saved_keys(name: str, config_class: type) -> dict[str, dict]:
    """The config class's saved-block rules, once every block check they name is registered."""
    schema = method_schema(config_class)
    unknown = sorted(r["name"] for r in schema.values() if r["kind"] == "check" and r["name"] not in BLOCK_CHECKS)
    if unknown:
        raise ValueError(
            f"Method {name!r} names block checks nobody registered: {', '.join(unknown)} (posswap_registry.block_check "
            "in its run-time module)."
        )
    return schema


def unregister_method(name: str) -> None:
    """Forget a method, its run time and its saved keys (a throwaway method a test registered). posswap's own
    methods are refused: removed, they would be gone for the rest of the process, and their saved folders with them."""
    spec = registered().get(name)
    if spec is not None and built_in(spec):
        raise ValueError(
            f"Method {name!r} is one of posswap's own and cannot be unregistered; only methods registered with "
            "register_method can be removed."
        )
    spec = METHODS.pop(name, None)
    if spec is not None and spec.runtime_module is not None:
        forget_runtime_module(name, spec.runtime_module)
    unregister(name)


def built_in(spec: MethodSpec) -> bool:
    """One of posswap's own methods: its config class is defined in ``posswap.methods``."""
    return spec.config_class.__module__.startswith(BUILT_IN + ".")


def get_method(name: str | None) -> MethodSpec:
    if name not in registered():
        raise ValueError(f"Unknown posswap method {name!r}; choose one of: {', '.join(sorted(METHODS))}.")
    return METHODS[name]


def study_variants() -> dict[str, tuple[MethodSpec, dict]]:
    """Every method's study variants in registration order: variant name -> (its method, its config keys)."""
    return {variant: (spec, keys) for spec in registered().values() for variant, keys in spec.variants.items()}
