"""The run time of a method registered from outside posswap, brought as one file that saved folders can carry.

``register_method(..., runtime_module=path)`` names a ``.py`` file written as posswap's own run-time modules are:
it imports torch, transformers, the standard library and posswap's run-time modules (relatively:
``from .posswap_registry import installer``), never the posswap package, and registers the method's installer.
It is loaded as a module of ``posswap.portable``, so those relative imports find posswap's run-time modules here,
and the copies beside it in a saved folder (``portable/posswap_carry.py``). Before that it is loaded once in a
fresh interpreter where posswap cannot be imported, as a saved folder loads it, which catches what reading its
imports cannot (``importlib.import_module("pos" + "swap")``).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from types import ModuleType

from .portable.posswap_registry import INSTALLERS, unregister

PORTABLE = Path(__file__).parent / "portable"
PACKAGE = __name__.rpartition(".")[0] + ".portable"
# Modules that import every method's run-time module: a method's module importing one would be a cycle in a folder.
IMPORTS_METHODS = {"modeling_posswap", "posswap_block", "posswap_runtime", "posswap_methods", "posswap_outside_methods"}
RELATIVE = "import posswap's run-time modules as `from .posswap_registry import installer`"
FOLDER_RULE = (
    "a saved folder runs it without posswap: import only torch, transformers, the standard library and posswap's "
    "run-time modules (relatively)"
)
FOLDER_LOAD_SECONDS = 300
# Run in a fresh interpreter: the module loaded as a saved folder loads it (trust_remote_code, posswap not
# installed): in a package of its own beside posswap's run-time modules. Prints what failed, as JSON.
FOLDER_LOAD = textwrap.dedent("""
    import importlib.abc, importlib.util, json, sys, traceback, types
    class NoPosswap(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "posswap" or name.startswith("posswap."):
                raise ModuleNotFoundError("No module named 'posswap' (a saved folder loads without posswap)")
    sys.meta_path.insert(0, NoPosswap())
    portable, path, stem = sys.argv[1:4]
    package = types.ModuleType("saved_folder")
    package.__path__ = [portable]
    sys.modules["saved_folder"] = package
    try:
        spec = importlib.util.spec_from_file_location("saved_folder." + stem, path)
        module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as error:
        lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == path]
        print(json.dumps({"error": f"{type(error).__name__}: {error}", "line": lines[-1] if lines else None}))
""")


def runtime_module_name(path) -> str | None:
    """The name ``path`` is loaded under (``posswap.portable.<its stem>``); None for what is no path."""
    return f"{PACKAGE}.{Path(path).stem}" if isinstance(path, (str, os.PathLike)) else None


def load_runtime_module(method: str, path: str | os.PathLike) -> ModuleType:
    """Check ``path`` (one line naming it and what to do), load it where posswap is not installed (as a saved folder
    does), then here as ``posswap.portable.<its name>``, and check that it registered ``method``'s installer and no
    other. The caller (``register_method``) undoes everything it registered on any error."""
    said = f"register_method({method!r}): runtime_module {path}"
    if runtime_module_name(path) is None:
        raise ValueError(f"register_method({method!r}): runtime_module must be the path of a .py file; got {path!r}.")
    path = Path(path)
    if method in INSTALLERS:
        raise ValueError(
            f"register_method({method!r}): an installer for {method!r} is already registered; with runtime_module "
            f"{path}, only that file registers it."
        )
    problem = runtime_problem(path) or folder_load_problem(path)
    if problem:
        raise ValueError(f"{said} {problem}.")
    before = set(INSTALLERS)
    module = _execute(said, path)
    _check_installers(method, said, module.__name__, set(INSTALLERS) - before)
    return module


def _execute(said: str, path: Path) -> ModuleType:
    """``path`` run as ``posswap.portable.<its stem>``; an error while it runs is one line naming its line."""
    name = runtime_module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if Path(f.filename) == path]
        where = f" (line {lines[-1]})" if lines else ""
        message = " ".join(f"{type(error).__name__}: {error}".split())
        raise ValueError(f"{said} fails when loaded: {message}{where}; fix the file.") from error
    return module


def _check_installers(method: str, said: str, name: str, registered: set[str]) -> None:
    """The module registered ``method``'s installer (from its own code) and no other method's."""
    others = sorted(registered - {method})
    install = INSTALLERS.get(method)
    if install is None or install.__module__ != name:
        besides = f" (it registers {', '.join(map(repr, others))})" if others else ""
        raise ValueError(
            f"{said} registers no installer for {method!r}{besides}; decorate its install function with "
            f"@installer({method!r}) (from .posswap_registry import installer)."
        )
    if others:
        raise ValueError(
            f"{said} also registers installers for {', '.join(map(repr, others))}; a runtime_module registers its "
            "own method's installer only: register those methods with their own files."
        )


def forget_runtime_module(method: str, name: str) -> None:
    unregister(method)
    sys.modules.pop(name, None)


def runtime_problem(path: Path) -> str | None:
    """Why saved folders could not carry the module at ``path`` ("imports posswap ..."), or None."""
    if not path.exists():
        return "does not exist; give the path of the method's run-time .py file"
    if path.suffix != ".py" or not path.is_file():
        return "must be a .py file"
    if not path.stem.isidentifier() or (PORTABLE / path.name).exists():
        return f"must have a name of its own (a Python name, not one of posswap's run-time modules); rename {path.name}"
    if runtime_module_name(path) in sys.modules:
        return f"has the name of a run-time module loaded already ({path.stem}, another method's); rename {path.name}"
    try:
        source = path.read_text(encoding="utf-8")
        compile(source, str(path), "exec", dont_inherit=True)  # what ast.parse lets pass: `from __future__` late
        tree = ast.parse(source, str(path))
    except UnicodeDecodeError:
        return "is not UTF-8 text"
    except (SyntaxError, ValueError) as error:
        line = f" (line {error.lineno})" if getattr(error, "lineno", None) else ""
        return f"does not compile: {getattr(error, 'msg', error)}{line}"
    imports = (node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom)))
    return next(filter(None, map(import_problem, imports)), None)


def folder_load_problem(path: Path) -> str | None:
    """Why the module at ``path`` fails to load where a saved folder loads it (a fresh interpreter in which posswap
    cannot be imported, beside posswap's run-time modules), or None: what reading its imports cannot tell, such
    as ``importlib.import_module("pos" + "swap")``."""
    command = [sys.executable, "-c", FOLDER_LOAD, str(PORTABLE), str(path), path.stem]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=FOLDER_LOAD_SECONDS
        )
    except subprocess.TimeoutExpired:
        return f"did not finish loading in {FOLDER_LOAD_SECONDS} s where posswap is not installed; {FOLDER_RULE}"
    except OSError as error:
        return f"could not be loaded in a fresh interpreter ({sys.executable}: {error.strerror}) to check it"
    report = next((line for line in reversed(done.stdout.splitlines()) if line.startswith('{"error"')), None)
    if report is None and done.returncode == 0:
        return None
    failure = json.loads(report) if report else {"error": f"exit status {done.returncode}", "line": None}
    where = f" (line {failure['line']})" if failure["line"] else ""
    message = " ".join(failure["error"].split())
    return f"fails to load where posswap is not installed, as in a saved folder: {message}{where}; {FOLDER_RULE}"


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
