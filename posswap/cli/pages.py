"""The generated parts of the README and the docs pages that ``python -m posswap.cli.generate --write`` writes
besides the code's files (in a clone; an installed package has no pages):

- the method tables (``<!-- posswap:methods-readme -->`` in the README, ``<!-- posswap:methods-index -->`` in
  docs/methods/index.md): a row per registered method (``posswap.registry.registered()``), its config class from
  the registry and its prose from its own page's front matter (``docs/methods/<name>.md``: ``what``, ``table``,
  ``pick``, and ``row``, its place in the tables), so a new method is in both tables by having its page;
- the results' tables and verdicts (``posswap:embeddings-*`` and ``posswap:context-*`` blocks of the README,
  docs/embeddings.md, docs/onnx.md and docs/late-chunking.md), from ``results/`` (:mod:`posswap.embeddings`'s
  reports), where the clone has ``results/``.

``tests/test_docs.py`` fails when a committed page differs from what these functions write.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]  # the clone
METHOD_PAGES = ROOT / "docs" / "methods"
METHOD_TABLES = {  # file -> (marker, its header, a row of it from the method's facts)
    "README.md": (
        "methods-readme",
        "| method | what it does | pick it when |\n|---|---|---|",
        "| [`{name}`](docs/methods/{name}.md) | {what} | {pick} |",
    ),
    "docs/methods/index.md": (
        "methods-index",
        "| method | config | what changes in the model | learned table | pick it when |\n|---|---|---|---|---|",
        "| [`{name}`]({name}.md) | `{config}` | {what} | {table} | {pick} |",
    ),
}
RESULT_PAGES = ("README.md", "docs/embeddings.md", "docs/onnx.md", "docs/late-chunking.md")
FRONT = re.compile(r"\A---\n(.*?)\n---\n", re.DOTALL)


def front_matter(path: Path) -> dict:
    """The YAML between a page's opening ``---`` lines (empty when it has none)."""
    found = FRONT.match(path.read_text(encoding="utf-8")) if path.is_file() else None
    return yaml.safe_load(found.group(1)) or {} if found else {}


def method_rows() -> list[dict[str, str]]:
    """A row per registered method, in the order of the pages' ``row`` (then the registry's): name, config class,
    and the page's ``what``, ``table`` and ``pick`` ("-" where the page does not say)."""
    from ..registry import registered

    rows = []
    for order, (name, spec) in enumerate(registered().items()):
        facts = front_matter(METHOD_PAGES / f"{name}.md")
        texts = {key: str(facts.get(key, "-")).strip() for key in ("what", "table", "pick")}
        rows.append(
            {"name": name, "config": spec.config_class.__name__, "row": (facts.get("row", 999), order), **texts}
        )
    return sorted(rows, key=lambda row: row["row"])


def block(text: str, marker: str, body: str, path: str) -> str:
    """``text`` with what is between ``<!-- posswap:MARKER -->`` and its end marker replaced by ``body``."""
    start, end = f"<!-- posswap:{marker} -->", f"<!-- /posswap:{marker} -->"
    if start not in text or end not in text:
        raise ValueError(f"{path} lacks {start} ... {end}")
    head, rest = text.split(start, 1)
    return head + start + "\n" + body + "\n" + end + rest.split(end, 1)[1]


def render_method_table(name: str) -> str:
    """The page ``name`` (a key of :data:`METHOD_TABLES`) with its method table written from the registry."""
    marker, header, row = METHOD_TABLES[name]
    body = "\n".join([header, *(row.format(**facts) for facts in method_rows())])
    return block((ROOT / name).read_text(encoding="utf-8"), marker, body, name)


def render_results(name: str) -> str:
    """The page ``name`` (one of :data:`RESULT_PAGES`) with every results block it holds written from results/."""
    from ..embeddings import report_context, report_tables

    text = (ROOT / name).read_text(encoding="utf-8")
    text = report_tables.rewritten(text, report_tables.blocks(), name)
    return report_context.rewritten(text, report_context.blocks())


def pages() -> list[tuple[Path, object]]:
    """(file, the function that writes it) for each page part of a clone: the method tables, then (where the clone
    has results/) the results' tables; each function reads the file as the one before it left it."""
    found = [(ROOT / name, lambda n=name: render_method_table(n)) for name in METHOD_TABLES if (ROOT / name).is_file()]
    if (ROOT / "results").is_dir():
        found += [(ROOT / name, lambda n=name: render_results(n)) for name in RESULT_PAGES if (ROOT / name).is_file()]
    return found
