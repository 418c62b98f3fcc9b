"""Rules of the code's shape, read from the source (ast): short functions, and one way into ``posswap/portable``."""

from __future__ import annotations

import ast
from pathlib import Path

import posswap

ROOT = Path(posswap.__file__).parent
MAX_LINES = 60  # a function reads top to bottom on one screen (issue 24)


def sources() -> dict[str, ast.Module]:
    return {
        str(p.relative_to(ROOT.parent)): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(ROOT.rglob("*.py"))
    }


def long_functions(trees: dict[str, ast.Module], limit: int = MAX_LINES) -> list[str]:
    """``path:name (lines)`` of every function longer than ``limit`` lines, from ``def`` to its last line."""
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_posswap_is_over_60_lines():
    found = long_functions(sources())
    assert not found, f"functions over {MAX_LINES} lines (split them into named steps): {', '.join(found)}"


MAX_FILE_LINES = 500  # a module with one job reads in one sitting (issue 46)


def test_no_file_in_posswap_is_over_500_lines():
    long = {
        str(p.relative_to(ROOT.parent)): n
        for p in sorted(ROOT.rglob("*.py"))
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines (split them by job): {long}"


def test_the_length_check_counts_from_def_to_the_end():
    code = "def f():\n" + "    x = 1\n" * 60 + "\n\ndef g():\n    return 1\n"
    assert long_functions({"m.py": ast.parse(code)}) == ["m.py:1 f (61 lines)"]
    assert long_functions({"m.py": ast.parse(code)}, limit=61) == []


def portable_names() -> dict[str, set[str]]:
    """posswap.portable.<module> -> the names defined at its top level."""
    names = {}
    for path in sorted((ROOT / "portable").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = set()
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        names[f"posswap.portable.{path.stem}"] = defined
    return names


def imported_from(path: str, node: ast.ImportFrom) -> str:
    """The absolute module of ``from <module> import ...`` in ``path`` (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    package = Path(path).with_suffix("").parts[: -node.level]
    return ".".join([*package, *([node.module] if node.module else [])])


def test_portable_names_are_imported_from_portable_only():
    """One rule for reaching posswap/portable from the main package: import a portable name from its portable
    module, never through a main-package module that re-exports it (the old shims functional.py, architectures.py)."""
    defined_in = {}
    for module, names in portable_names().items():
        for name in names:
            defined_in.setdefault(name, set()).add(module)
    trees = sources()
    reexports = {}  # main-package module -> portable names it imports (and so could hand on)
    for path, tree in trees.items():
        if "/portable/" not in path:
            module = path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            reexports[module] = {
                alias.asname or alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and imported_from(path, node).startswith("posswap.portable.")
                for alias in node.names
            }
    through = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and imported_from(path, node) in reexports:
                source = imported_from(path, node)
                through += [
                    f"{path} imports {a.name} from {source}"
                    for a in node.names
                    if a.name in reexports[source] and a.name in defined_in and source != "posswap"
                ]
    assert not through, f"import these from posswap.portable.<module> directly: {'; '.join(through)}"
    assert not (ROOT / "functional.py").exists()


def module_name(path: str) -> str:
    name = ".".join(Path(path).with_suffix("").parts)
    return name.removesuffix(".__init__")


def imports(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module -> the posswap modules it imports anywhere in its code (a lazy import inside a function counts: it
    only hides a cycle from Python, not from the reader)."""
    modules = {module_name(path): path for path in trees}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        for node in ast.walk(trees[path]):
            if isinstance(node, ast.ImportFrom):
                parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join([*parts, *([node.module] if node.module else [])])
                for alias in node.names:
                    found = f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target
                    if found in modules and found != name:
                        graph[name].add(found)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in modules and alias.name != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected group of more than one module (or a module importing itself)."""
    order, low, stack, found, counter = {}, {}, [], [], iter(range(len(graph) * 2))

    def visit(node: str) -> None:
        order[node] = low[node] = next(counter)
        stack.append(node)
        for other in graph[node]:
            if other not in order:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], order[other])
        if low[node] == order[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def test_no_import_cycles_among_posswap_modules():
    # The package __init__ files re-export names: an edge to a package is an edge to its own modules.
    graph = {name: {t for t in targets if t not in ("posswap",)} for name, targets in imports(sources()).items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_lazy_cycle():
    trees = {
        "posswap/a.py": ast.parse("from .b import f\n"),
        "posswap/b.py": ast.parse("def f():\n    from .a import g\n"),
        "posswap/c.py": ast.parse("from . import a\n"),
    }
    assert cycles(imports(trees)) == [["posswap.a", "posswap.b"]]
