"""Optional dependencies: each comes with one of posswap's extras (``pyproject.toml``), and a missing one is an error
that names the extra to install, which the command line reports as a user's fix (one line, exit 2)."""

from __future__ import annotations


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra installs it."""


def install_command(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'posswap[demo]'``."""
    return f"pip install 'posswap[{extra}]'"


def require(extra: str, *modules: str, needed_for: str) -> None:
    """Import ``modules`` (what ``extra`` brings) now, before any work: a missing one is one line that names it and
    the extra (``ONNX export needs onnx, onnxruntime and onnxscript (onnx is missing): pip install ...``)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as error:  # also a module set to None in sys.modules, or one whose own import fails
            names = ", ".join(modules[:-1]) + " and " + modules[-1] if len(modules) > 1 else modules[0]
            raise MissingExtra(
                f"{needed_for} needs {names} ({error.name or name} is missing): {install_command(extra)}"
            ) from None
