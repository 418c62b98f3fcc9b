"""A saved folder carries the run-time module of a method registered outside posswap.

transformers copies ``modeling_posswap.py`` and the files it imports beside the weights; a method registered from
outside posswap (``register_method(..., runtime_module=path)``) lives elsewhere, so :func:`carry_method` copies its
module in too and writes the folder's ``posswap_outside_methods.py`` to import it. That file then imports the
module in the folder, so transformers copies both again when the folder's model is saved without posswap.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from .posswap_registry import CARRIED, INSTALLERS, SCHEMAS
from .posswap_rules import literal

LOADER = "posswap_outside_methods.py"


def carry_method(block, folder: str | os.PathLike) -> None:
    """Where ``block``'s method is carried (:func:`posswap_registry.carry`), copy the module of its installer into
    ``folder`` and write the folder's loader to import it; any other block: nothing (the loader names none)."""
    method = block.get("method") if isinstance(block, dict) else None
    if method not in CARRIED:
        return
    install = INSTALLERS[method]
    source = Path(sys.modules[install.__module__].__file__)
    target = Path(folder) / source.name
    if not (target.exists() and os.path.samefile(source, target)):
        shutil.copyfile(source, target)
    (Path(folder) / LOADER).write_text(loader_source(method, source.stem, install.__name__), encoding="utf-8")


def loader_source(method: str, module: str, install: str) -> str:
    """The text of a folder's ``posswap_outside_methods.py`` that carries ``method`` (its installer ``install``
    in ``module``.py beside it)."""
    # Import lines built, not written in a template: transformers copies every file that a line of this file
    # starting with "from ." names, and "{module}.py" is none.
    imports = [f"from .{name} import {names}" for name, names in (("posswap_registry", "carry"), (module, install))]
    return "\n".join(
        [
            '"""The run-time modules of methods registered outside posswap that this folder carries.',
            "",
            f"Written by posswap's save_pretrained (posswap_carry.py): method {method!r} runs {module}.py, beside this.",
            '"""',
            "",
            imports[0],
            imports[1] + "  # noqa: F401  (registers the method's installer)",
            "",
            f"carry({literal(method)}, {literal(SCHEMAS[method])})",
            f"CARRIED_HERE = ({literal(method)},)",
            "",
        ]
    )
