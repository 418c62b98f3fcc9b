"""posswap: swap the learned position table of pretrained BERT-family and GPT-2 checkpoints for one that reaches
further (a longer table, RoPE, ALiBi, T5 bias, TUPE, a fixed sinusoid or none), then train, evaluate and share the
result."""

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING

from .version import __version__ as __version__

# The public names besides the method configs. Each is imported on first use (``posswap.patch``, ``from posswap import
# patch``), so ``import posswap`` costs nothing and a user pays for what they use: a config brings torch, the
# training names bring datasets and accelerate. Type checkers and the API reference read the imports below; the
# run time reads where each name lives from them (``_where``).
if TYPE_CHECKING:
    from .config import PositionConfig, config_from_dict  # noqa: F401
    from .embeddings.late_chunking import late_chunk_pieces, late_chunks  # noqa: F401
    from .embeddings.text_pieces import split_text  # noqa: F401
    from .evaluation import Results, evaluate  # noqa: F401
    from .export import export  # noqa: F401
    from .hub import model_card, push_to_hub  # noqa: F401
    from .loading import from_pretrained  # noqa: F401
    from .onnx.encoder import OnnxEncoder  # noqa: F401
    from .patching import patch, patched_config  # noqa: F401
    from .portable.posswap_architectures import ARCHITECTURES  # noqa: F401
    from .training import load_recipe, train  # noqa: F401

# Names that were in the README of an earlier posswap -> their names now.
_RENAMED = {"NoPEConfig": "NopeConfig", "functional": "portable.posswap_functional"}
_FOUND: dict[str, dict[str, str]] = {}


def _configs() -> dict[str, str]:
    """Each method's config class -> its module, read once from the sources of posswap/methods (no import: a new
    method is exported by being there): every class there that derives from ``PositionConfig``."""
    if "configs" not in _FOUND:
        found = _FOUND.setdefault("configs", {})
        for path in sorted((Path(__file__).parent / "methods").glob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and any(
                    getattr(b, "id", None) == "PositionConfig" for b in node.bases
                ):
                    found[node.name] = f"methods.{path.stem}"
    return _FOUND["configs"]


def _where() -> dict[str, str]:
    """Public name -> its module, read once from this file's ``TYPE_CHECKING`` imports (one list, not two)."""
    if "names" not in _FOUND:
        tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
        block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
        _FOUND["names"] = {alias.name: node.module for node in block.body for alias in node.names}
    return _FOUND["names"]


def _public() -> list[str]:
    return sorted([*_where(), *_configs(), "__version__"], key=lambda n: (not n[0].isupper(), n.lower()))


def __getattr__(name: str):
    if name == "__all__":  # read on first use (``from posswap import *``, the docs' check), then kept
        return globals().setdefault("__all__", _public())
    where = _where().get(name) or (_configs().get(name) if name.endswith("Config") else None)
    if where is not None:
        value = getattr(importlib.import_module(f".{where}", __name__), name)
        if name != "export":  # found once: the next use is a plain attribute (export: the property above)
            globals()[name] = value
        return value
    if name in _RENAMED:
        raise AttributeError(f"posswap.{name} was renamed posswap.{_RENAMED[name]}; use posswap.{_RENAMED[name]}.")
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)  # a submodule, as before any was imported
    raise AttributeError(f"module 'posswap' has no attribute {name!r}")


class _Package(types.ModuleType):
    """posswap's module type: ``posswap.export`` stays the function when its module ``posswap/export.py`` is imported
    (the import system sets a loaded submodule as its package's attribute; this property ignores that)."""

    @property
    def export(self):
        return __getattr__("export")

    @export.setter
    def export(self, value) -> None:
        pass  # the submodule, bound by the import system: it stays sys.modules["posswap.export"]


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted({*globals(), *_public()})
