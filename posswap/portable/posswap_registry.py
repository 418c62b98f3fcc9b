"""The portable side of a method's registration: what a saved model needs of a method, keyed by its name.

A method's run-time module (``posswap_<name>.py``) registers here, with :func:`installer` (how a model runs it),
:func:`block_check` (a check of its saved block that one rule cannot say, e.g. one key bounded by another) and,
for a method from outside posswap, :func:`register_schema` (its saved keys) or :func:`carry` (its saved keys, and
its run-time module travels with saved folders: ``posswap_carry.py``). posswap's own methods' saved keys are in the
generated ``posswap_schema.py``. ``posswap_methods.py`` imports every run-time module once.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from collections.abc import Callable

from .posswap_schema import SCHEMA

# method -> install(model, sites, block): makes the model run as its saved block says (posswap_runtime).
INSTALLERS: dict[str, Callable] = {}
# Methods that keep the learned table (the others drop it unless their block says absolute: keep).
KEEPS_TABLE: set[str] = set()
# method -> block -> whether a model patched so runs posswap's code (default: always).
RUNTIME_CODE: dict[str, Callable[[dict], bool]] = {}
# method -> key -> rule (plain data, see posswap_rules): posswap's own from posswap_schema, plus any registered.
SCHEMAS: dict[str, dict[str, dict]] = {method: dict(keys) for method, keys in SCHEMA.items()}
# name -> check(value, block) -> problem or None: the checks the rule kind "check" names.
BLOCK_CHECKS: dict[str, Callable] = {}
# Methods from outside posswap whose run-time module (the one defining their installer) saved folders carry.
CARRIED: set[str] = set()


def installer(method: str, *, keeps_table: bool = False, runtime_code: Callable[[dict], bool] | None = None):
    """Decorator: ``install`` runs ``method`` in a model. ``keeps_table``: the learned table stays (the method
    resizes it); ``runtime_code(block)``: False where a block of the method changed weights only, so that its
    saved folder loads as plain transformers (no code carried)."""

    def register(install: Callable) -> Callable:
        if method in INSTALLERS and INSTALLERS[method] is not install:
            raise ValueError(f"A run-time installer for method {method!r} is already registered.")
        INSTALLERS[method] = install
        if keeps_table:
            KEEPS_TABLE.add(method)
        if runtime_code is not None:
            RUNTIME_CODE[method] = runtime_code
        return install

    return register


def block_check(check: Callable) -> Callable:
    """Decorator: ``check(value, block)`` -> a problem ("must be ...") or None, for the rule ``check(name)``."""
    BLOCK_CHECKS[check.__name__] = check
    return check


def register_schema(method: str, keys: dict[str, dict]) -> None:
    """The saved keys of a method posswap's generated schema does not hold (a method registered from outside)."""
    if method in SCHEMAS and SCHEMAS[method] != keys:
        raise ValueError(f"Method {method!r} already has saved keys: {sorted(SCHEMAS[method])}.")
    SCHEMAS[method] = dict(keys)


def carry(method: str, keys: dict[str, dict]) -> None:
    """A method from outside posswap whose installer's module is self-contained (register_method's runtime_module,
    or a saved folder's own ``posswap_outside_methods.py``): its saved keys, and saved folders carry that module."""
    register_schema(method, keys)
    CARRIED.add(method)


def unregister(method: str) -> None:
    """Forget a method's run time and saved keys (a throwaway method registered by a test)."""
    for table in (INSTALLERS, RUNTIME_CODE):
        table.pop(method, None)
    KEEPS_TABLE.discard(method)
    CARRIED.discard(method)
    if method not in SCHEMA:
        SCHEMAS.pop(method, None)
