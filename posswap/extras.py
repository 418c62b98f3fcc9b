"""Optional dependencies: each comes with one of posswap's extras (``pyproject.toml``), and a missing one is an error
that names the extra to install, which the command line reports as a user's fix (one line, exit 2)."""

from __future__ import annotations


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message says which extra installs it."""


def install_command(extra: str) -> str:
    """The command that installs ``extra``: ``pip install 'posswap[demo]'``."""
    return f"pip install 'posswap[{extra}]'"
