"""The recipes that ship with posswap: ``recipes/`` at the top of a clone, ``posswap/recipes`` inside the wheel (the
build maps one to the other, ``pyproject.toml``). ``posswap train NAME`` and ``posswap.load_recipe(NAME)`` take a
shipped recipe by its name (the file's name without ``.yaml``) wherever posswap is installed; a path still works."""

from __future__ import annotations

from pathlib import Path

SUFFIX = ".yaml"


def recipes_folder() -> Path:
    """Where the shipped recipes are: beside the package in an installed wheel, else at the top of the clone the
    package is imported from (an editable install, or a clone on ``PYTHONPATH``)."""
    package = Path(__file__).resolve().parent
    installed = package / "recipes"
    return installed if installed.is_dir() else package.parent / "recipes"


def shipped_recipes() -> dict[str, Path]:
    """Name -> file of each shipped training recipe (the accelerate configs under ``accelerate/`` are not recipes)."""
    return {path.name[: -len(SUFFIX)]: path for path in sorted(recipes_folder().glob("*" + SUFFIX))}


def purpose(path: Path) -> str:
    """A recipe's one-line purpose: the first line of the comment that opens the file ("" without one)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.strip()[1:].strip() if line.lstrip().startswith("#") else ""
    return ""


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
    raise ValueError(
        f"No recipe file {str(name_or_path)!r} and no shipped recipe of that name; give a YAML file, or the name of "
        f"a shipped recipe: {names} (posswap train --list)."
    )
