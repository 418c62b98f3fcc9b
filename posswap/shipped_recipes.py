"""The recipes that ship with posswap: ``recipes/`` at the top of a clone, ``posswap/recipes`` inside the wheel (the
build maps one to the other, ``pyproject.toml``). ``posswap train NAME`` and ``posswap.load_recipe(NAME)`` take a
shipped recipe by its name (the file's name without ``.yaml``) wherever posswap is installed; a path still works."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

SUFFIX = ".yaml"


class LocalRecipePassedOver(UserWarning):
    """``load_recipe(NAME)`` took the shipped recipe NAME although the working folder has a file ``NAME.yaml``."""


@dataclass(frozen=True)
class RecipeFile:
    """The file a recipe was read from; ``shipped``: its name, when it is one of posswap's; ``passed_over``: a file
    of that name in the working folder that a bare NAME does not take (``./NAME.yaml`` does)."""

    path: Path
    shipped: str | None = None
    passed_over: str | None = None

    def describe(self) -> str:
        """One line: which file runs, and which local one does not."""
        if self.shipped is None:
            return f"recipe file {self.path}"
        line = f"recipe {self.shipped}, the shipped file {self.path}"
        if self.passed_over is not None:
            line += (
                f"; not {self.passed_over} in this folder, which a bare name does not read: run that one with "
                f"posswap train {self.passed_over}"
            )
        return line


def recipes_folder() -> Path:
    """Where the shipped recipes are: beside the package in an installed wheel, else at the top of the clone the
    package is imported from (an editable install, or a clone on ``PYTHONPATH``)."""
    package = Path(__file__).resolve().parent
    installed = package / "recipes"
    return installed if installed.is_dir() else package.parent / "recipes"


def shipped_recipes() -> dict[str, Path]:
    """Name -> file of each shipped training recipe (the accelerate configs under ``accelerate/`` are not recipes)."""
    found = {path.name[: -len(SUFFIX)]: path for path in recipes_folder().glob("*" + SUFFIX)}
    return dict(sorted(found.items()))  # by name: "minilm-late-2k" before "minilm-late-2k-natural"


def purpose(path: Path) -> str:
    """A recipe's one-line purpose: the first line of the comment that opens the file ("" without one)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.strip()[1:].strip() if line.lstrip().startswith("#") else ""
    return ""


def find_recipe(name_or_path: str | Path) -> RecipeFile:
    """:func:`recipe_file`, with what :class:`RecipeFile` says about it."""
    path = recipe_file(name_or_path)
    shipped = {file.resolve(): name for name, file in shipped_recipes().items()}.get(path.resolve())
    passed_over = None
    if shipped is not None and str(name_or_path) == shipped:  # a bare name: a local NAME.yaml is not read
        local = [f"./{shipped}{suffix}" for suffix in (SUFFIX, ".yml") if Path(shipped + suffix).is_file()]
        passed_over = local[0] if local else None
    return RecipeFile(Path(os.path.abspath(path)), shipped, passed_over)


def recipe_file(name_or_path: str | Path) -> Path:
    """The file ``name_or_path`` names: an existing file as given, else the shipped recipe of that name. Neither is
    one line that lists the shipped names."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = shipped_recipes()
    if str(name_or_path) in shipped:
        return shipped[str(name_or_path)]
    names = ", ".join(shipped) or f"none found in {recipes_folder()}"
    stem = path.name[: -len(SUFFIX)] if path.name.endswith(SUFFIX) else None
    if stem in shipped:  # recipes/minilm-embed-2k.yaml typed outside a clone: the README's form
        raise ValueError(
            f"No recipe file {str(name_or_path)!r} here; the shipped recipe of that name is {stem!r}: posswap train {stem}."
        )
    near = difflib.get_close_matches(stem or path.name, list(shipped), n=1)
    raise ValueError(
        f"No recipe file {str(name_or_path)!r} and no shipped recipe of that name"
        + (f" (did you mean {near[0]}?)" if near else "")
        + f"; give a YAML file, or the name of a shipped recipe: {names} (posswap train --list)."
    )
