"""The layers of CONTRIBUTING.md, read from the file and checked against every import in posswap/ (lazy ones too):
no arrow from a lower layer to a higher one, and every module in a layer."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_code_shape import imports, sources

CONTRIBUTING = Path(__file__).parents[1] / "CONTRIBUTING.md"


def layers(text: str) -> dict[str, int]:
    """Module prefix -> its layer's rank (0: the highest), from the numbered list between the layer markers."""
    block = text.split("<!-- layers: highest first -->", 1)[1].split("<!-- layers end -->", 1)[0]
    ranks = {}
    for rank, line in enumerate(re.findall(r"^\d+\. (.+?):", block, flags=re.MULTILINE)):
        for module in re.findall(r"`([\w.]+)`", line):
            ranks[module] = rank
    return ranks


def layer_of(module: str, ranks: dict[str, int]) -> int | None:
    """The rank of the longest listed prefix of ``module`` (``posswap.cli.main`` is in ``posswap.cli``'s layer). The
    package itself (``posswap``) holds its ``__init__`` only: a module no layer names is in none, not in the top one."""
    parts = module.split(".")
    if module in ranks:
        return ranks[module]
    for end in range(len(parts) - 1, 1, -1):
        if ".".join(parts[:end]) in ranks:
            return ranks[".".join(parts[:end])]
    return None


def upward_arrows(graph: dict[str, set[str]], ranks: dict[str, int]) -> list[str]:
    names = {rank: [m for m, r in ranks.items() if r == rank][0] for rank in ranks.values()}
    return [
        f"{module} ({names[layer_of(module, ranks)]}) imports {target} ({names[layer_of(target, ranks)]})"
        for module, targets in sorted(graph.items())
        for target in sorted(targets)
        if None not in (layer_of(target, ranks), layer_of(module, ranks))  # unplaced: the test above names it
        and layer_of(target, ranks) < layer_of(module, ranks)
    ]


def test_every_module_is_in_a_layer():
    ranks = layers(CONTRIBUTING.read_text(encoding="utf-8"))
    unplaced = sorted(m for m in imports(sources()) if layer_of(m, ranks) is None)
    assert not unplaced, f"add these to a layer in CONTRIBUTING.md: {', '.join(unplaced)}"


def test_no_import_points_up_a_layer():
    ranks = layers(CONTRIBUTING.read_text(encoding="utf-8"))
    arrows = upward_arrows(imports(sources()), ranks)
    assert not arrows, "imports that point up a layer (CONTRIBUTING.md, the layers): " + "; ".join(arrows)


def test_the_layer_check_finds_a_lazy_arrow_up():
    text = "<!-- layers: highest first -->\n1. `posswap.cli`: top\n2. `posswap.core`: bottom\n<!-- layers end -->"
    trees = {
        "posswap/cli/main.py": ast.parse("from ..core import f\n"),
        "posswap/core.py": ast.parse("def f():\n    from .cli.main import g\n"),
    }
    ranks = layers(text)
    assert ranks == {"posswap.cli": 0, "posswap.core": 1}
    assert upward_arrows(imports(trees), ranks) == [
        "posswap.core (posswap.core) imports posswap.cli.main (posswap.cli)"
    ]


def test_a_module_no_layer_names_is_in_no_layer():
    """The top layer (the package) does not catch what the list forgets: a new module fails until a layer names it."""
    text = "<!-- layers: highest first -->\n1. `posswap`: top\n2. `posswap.cli`: cli\n<!-- layers end -->"
    ranks = layers(text)
    assert layer_of("posswap", ranks) == 0 and layer_of("posswap.cli.main", ranks) == 1
    assert layer_of("posswap.orphan", ranks) is None and layer_of("posswap.orphan.deep", ranks) is None
