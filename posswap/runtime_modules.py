"""The run time of a method registered from outside posswap, brought as one file that saved folders can carry.

``register_method(..., runtime_module=path)`` names a ``.py`` file written as posswap's own run-time modules are:
it imports torch, transformers, the standard library and posswap's run-time modules (relatively:
``from .posswap_registry import installer``), never the posswap package, and registers the method's installer.
It is loaded as a module of ``posswap.portable``, so those relative imports find posswap's run-time modules here,
and the copies beside it in a saved folder (``portable/posswap_carry.py``).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from .portable.posswap_registry import INSTALLERS, unregister

PORTABLE = Path(__file__).parent / "portable"
PACKAGE = __name__.rpartition(".")[0] + ".portable"
# Modules that import every method's run-time module: a method's module importing one would be a cycle in a folder.
IMPORTS_METHODS = {"modeling_posswap", "posswap_block", "posswap_runtime", "posswap_methods", "posswap_outside_methods"}
RELATIVE = "import posswap's run-time modules as `from .posswap_registry import installer`"


def load_runtime_module(method: str, path: str | os.PathLike) -> ModuleType:
    """Check ``path`` (one line naming it and what to do), load it as ``posswap.portable.<its name>`` and check
    that it registered ``method``'s installer; nothing stays registered on any error."""
    path = Path(path)
    if method in INSTALLERS:
        raise ValueError(
            f"register_method({method!r}): an installer for {method!r} is already registered; with runtime_module "
            f"{path}, only that file registers it."
        )
    problem = runtime_problem(path)
    if problem:
        raise ValueError(f"register_method({method!r}): runtime_module {path} {problem}.")
    name = f"{PACKAGE}.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        install = INSTALLERS.get(method)
        if install is None or install.__module__ != name:
            raise ValueError(
                f"register_method({method!r}): runtime_module {path} registers no installer for {method!r}; "
                f"decorate its install function with @installer({method!r}) (from .posswap_registry import installer)."
            )
    except BaseException:
        forget_runtime_module(method, name)
        raise
    return module


def forget_runtime_module(method: str, name: str) -> None:
    unregister(method)
    sys.modules.pop(name, None)


def runtime_problem(path: Path) -> str | None:
    """Why saved folders could not carry the module at ``path`` ("imports posswap ..."), or None."""
    if path.suffix != ".py" or not path.is_file():
        return "must be a .py file"
    if not path.stem.isidentifier() or (PORTABLE / path.name).exists():
        return f"must have a name of its own (a Python name, not one of posswap's run-time modules); rename {path.name}"
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except SyntaxError as error:
        return f"does not parse: {error.msg} (line {error.lineno})"
    imports = (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
    return next(filter(None, map(import_problem, imports)), None)


def import_problem(node: ast.Import | ast.ImportFrom) -> str | None:
    """Why a folder without posswap could not run this import, or None."""
    if isinstance(node, ast.Import) or node.level == 0:
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module]
        library = next((n for n in names if n.split(".")[0] == "posswap"), None)
        if library:
            return f"imports {library} (the posswap package), which a folder loaded without posswap cannot; {RELATIVE}"
        return None
    shown = "." * node.level + (node.module or "")
    if node.level > 1 or not node.module:
        return f"imports `from {shown} import ...`, a form transformers does not copy into folders; {RELATIVE}"
    if not (PORTABLE / f"{node.module}.py").exists():
        return f"imports {shown}, which is none of posswap's run-time modules (posswap/portable); no folder carries it"
    if node.module in IMPORTS_METHODS:
        return f"imports {shown}, which imports every method's run time itself (a cycle in a saved folder)"
    return None
