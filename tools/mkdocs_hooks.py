"""mkdocs hooks (``hooks:`` in mkdocs.yml): what the site shows that the code already knows, filled in at build time so
it cannot go stale.

- ``<!-- posswap:options RopeConfig -->`` becomes the options table of that config dataclass, from its fields' ``help``
  metadata (the text ``posswap patch --help`` prints); a dotted path names a dataclass elsewhere in posswap.
- ``<!-- posswap:cli patch -->`` becomes ``posswap patch --help`` (``<!-- posswap:cli -->``: ``posswap --help``);
  ``<!-- posswap:usage -->`` becomes every command's usage line, so the page's synopsis is the parser's.
- ``<!-- posswap:method-configs -->`` becomes each method's config, its docstring and its options table (the API
  reference); the Methods section of the nav gets a page per ``docs/methods/<name>.md``: a new method is on the site
  by having its module and its page.
- ``<!-- posswap:families -->`` becomes the supported-families table, from posswap's architecture table.
- ``<!-- posswap:include CONTRIBUTING.md -->`` becomes that file of the repository root, its links into ``docs/``
  made relative to the site (and its links to CHANGELOG.md to that file's page), so the file GitHub shows and the
  site's page are one text.
- Sphinx roles in docstrings (``:func:`posswap.patch```) show as plain code: mkdocstrings renders the role's
  name as text.
- A pipe escaped inside a code span of a table row (`\\|i - j\\|` in the source, as GitHub needs it) shows as ``|``: Python-Markdown
  already keeps a code span's pipes in their cell and would print the backslash.
- Each word of inline code (an option name, a path; up to 30 characters) is kept on one line (``posswap-word``,
  extra.css): the theme breaks code anywhere, so ``--overwrite`` could end one line with ``-`` and start the next with
  ``-overwrite``. Code of several words still wraps between them; a longer word may still break.
- The pictures under ``results/`` are added to the site as ``results/...``, so the study pages link to them where
  they are (``../results/copying/probe.png`` from ``docs/study/``) instead of a second copy in ``docs/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from html import escape as html_escape
from html import unescape as html_unescape
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
SPHINX_ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):(?=<code>)")
# Inline code as Python-Markdown writes it: no markup inside, one line (a code block's <code> follows <pre> or a span).
INLINE_CODE = re.compile(r"(?<!<pre>)(?<!</span>)<code>([^<\n]*)</code>")
WORD = re.compile(r"\S+")
KEPT_WORD = 30  # characters: longer words may have to break on a phone
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
MARKER = re.compile(
    r"^<!-- posswap:(options|cli|usage|include|families|results)(?: ([\w./-]+))? -->$", re.MULTILINE
)  # alone on a line
METHOD_CONFIGS = "<!-- posswap:method-configs -->"
METHODS_SECTION = "Methods"  # the nav section the method pages are added to


def options_table(name: str) -> str:
    """The fields of ``posswap.<name>`` (or of the dataclass at the dotted path ``name``) as a markdown table:
    option, type, default, what it does."""
    import importlib

    import posswap

    module, _, attribute = name.rpartition(".")
    try:
        config = getattr(importlib.import_module(module) if module else posswap, attribute, None)
    except ImportError:  # a dotted path to no module: the same one-line error as a missing name
        config = None
    if config is None or not dataclasses.is_dataclass(config):
        raise ValueError(f"posswap:options {name}: posswap has no config dataclass of that name.")
    rows = ["| option | type | default | what it does |", "| --- | --- | --- | --- |"]
    for found in dataclasses.fields(config):
        if found.default is not dataclasses.MISSING:
            default = f"`{found.default!r}`"
        elif found.default_factory is not dataclasses.MISSING:
            default = f"`{found.default_factory()!r}`"
        else:
            default = "required"
        kind = str(found.type).replace("|", "or")
        text = found.metadata.get("help", "").replace("|", "\\|")
        rows.append(f"| `{found.name}` | {kind} | {default} | {text} |")
    return "\n".join(rows)


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """Command name -> its parser, as ``posswap`` builds them ("" -> the top-level parser)."""
    from posswap.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **commands.choices}


def formatted(format_text) -> str:
    """``format_text()`` of an argparse parser at a fixed width, so the page does not depend on a terminal."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"  # argparse reads the width when it formats; put back for the rest of mkdocs
    try:
        return format_text().rstrip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def cli_help(command: str | None) -> str:
    """``posswap [COMMAND] --help`` as argparse prints it."""
    parsers = command_parsers()
    if (command or "") not in parsers:
        raise ValueError(f"posswap:cli {command}: posswap has no such command ({', '.join(list(parsers)[1:])}).")
    return "```text\n" + formatted(parsers[command or ""].format_help) + "\n```"


def cli_usage(_: str | None = None) -> str:
    """Every command's usage, as its ``--help`` starts: the page's synopsis, never typed by hand. One line a command,
    not argparse's lines wrapped at a terminal's width (a phone wraps them again, ragged): the browser wraps each
    line to the column, its continuation lines indented (``.posswap-usage`` in extra.css)."""
    usages = [formatted(parser.format_usage) for name, parser in command_parsers().items() if name]
    lines = [" ".join(usage.removeprefix("usage: ").split()) for usage in usages]
    return "```{.text .posswap-usage}\n" + "\n".join(lines) + "\n```"


# The files of the repository root that are pages of the site too (the page holds only their include marker).
INCLUDED = {"CONTRIBUTING.md": "contributing.md", "CHANGELOG.md": "changelog.md"}


def families(_: str | None = None) -> str:
    from posswap.methods.architectures import families_table

    return families_table()


def include(name: str) -> str:
    """A markdown file of the repository root, with its ``docs/...`` links made relative to the docs folder and its
    links to another included root file pointed at that file's page."""
    found = ROOT / name
    if not found.is_file():
        raise ValueError(f"posswap:include {name}: no such file at the repository root.")
    text = found.read_text().replace("](docs/", "](")
    for root_file, page in INCLUDED.items():
        text = text.replace(f"]({root_file}", f"]({page}")
    return text


def unescape_table_code(markdown: str) -> str:
    """``\\|`` as ``|`` inside the code spans of table rows (lines that start with ``|``); the rest unchanged."""

    def code(match: re.Match) -> str:
        return match.group(0).replace("\\|", "|")

    lines = markdown.split("\n")
    return "\n".join(CODE_SPAN.sub(code, line) if line.lstrip().startswith("|") else line for line in lines)


def method_configs() -> str:
    """``::: posswap.methods.<name>.<Config>`` and its options marker for each method's config, in the methods'
    order."""
    from posswap.registry import registered

    # The module path: ``posswap.<Config>`` is imported on first use, which the reference's static reader cannot see.
    classes = [spec.config_class for spec in registered().values() if spec.runtime_module is None]
    return "\n\n".join(f"::: {c.__module__}.{c.__name__}\n\n<!-- posswap:options {c.__name__} -->" for c in classes)


def method_pages(docs: Path = ROOT / "docs") -> list[dict[str, str]]:
    """The nav entries of the method pages: ``{name: methods/<name>.md}`` for each page but the index, in the
    methods' order (any other page after them)."""
    from posswap.registry import registered

    order = list(registered())
    pages = [p.stem for p in (docs / "methods").glob("*.md") if p.stem != "index"]
    pages.sort(key=lambda name: (order.index(name) if name in order else len(order), name))
    return [{name: f"methods/{name}.md"} for name in pages]


def on_config(config):
    section = next(item for item in config["nav"] if isinstance(item, dict) and METHODS_SECTION in item)
    listed = {path for entry in section[METHODS_SECTION] for path in entry.values()}
    section[METHODS_SECTION] += [page for page in method_pages() if next(iter(page.values())) not in listed]
    return config


def results_table(folder: str) -> str:
    """The table of a committed evaluation folder of the repository (``retrieval.json`` or ``context.json``), as
    ``posswap eval`` printed it when it wrote the folder."""
    from posswap.embeddings.context_retrieval import ContextResults
    from posswap.embeddings.retrieval import RetrievalResults

    path = ROOT / folder
    if (path / "context.json").exists():
        return ContextResults.load(path).table()
    if (path / "retrieval.json").exists():
        return RetrievalResults.load(path).table()
    raise ValueError(f"posswap:results {folder}: no retrieval.json or context.json there.")


def on_page_markdown(markdown: str, page, config, files) -> str:
    if METHOD_CONFIGS in markdown:  # before the options markers it writes are filled
        markdown = markdown.replace(METHOD_CONFIGS, method_configs())

    def fill(match: re.Match) -> str:
        kind, name = match.groups()
        fills = {
            "options": options_table,
            "cli": cli_help,
            "usage": cli_usage,
            "include": include,
            "families": families,
            "results": results_table,
        }
        return fills[kind](name)

    return unescape_table_code(MARKER.sub(fill, markdown))


def unbroken_words(html: str) -> str:
    """Each word of every inline code element wrapped in ``<span class="posswap-word">`` (no break inside it)."""

    def words(match: re.Match) -> str:
        def keep(word: re.Match) -> str:
            text = word.group(0)
            return f'<span class="posswap-word">{text}</span>' if 1 < len(html_unescape(text)) <= KEPT_WORD else text

        kept = WORD.sub(keep, match.group(1))
        return f"<code>{kept}</code>"

    return INLINE_CODE.sub(words, html)


USAGE = re.compile(r'(<div class="posswap-usage[^"]*"><pre><span></span><code>)(.*?)(</code>)', re.DOTALL)


def usage_words(html: str) -> str:
    """The synopsis (``.posswap-usage``) wraps between its words, not inside a flag at its hyphens
    (``[--max-`` / ``length MAX_LENGTH]``): each word is kept whole; a list of choices longer than a phone's line
    may break after its commas."""

    def words(match: re.Match) -> str:
        def keep(word: re.Match) -> str:
            pieces = word.group(0).split(",") if len(html_unescape(word.group(0))) > KEPT_WORD else [word.group(0)]
            return ",<wbr>".join(f'<span class="posswap-word">{piece}</span>' for piece in pieces)

        return match.group(1) + WORD.sub(keep, match.group(2)) + match.group(3)

    return USAGE.sub(words, html)


TABLE = re.compile(r"<table>.*?</table>", re.DOTALL)
ROW = re.compile(r"<tr>.*?</tr>", re.DOTALL)
CELL = re.compile(r"<(t[hd])([^>]*)>(.*?)</\1>", re.DOTALL)
TAG = re.compile(r"<[^>]+>")
PROSE_WORDS = 12  # a cell this long is a sentence: its table becomes a list on a phone


def stacked_tables(html: str) -> str:
    """Each table with a cell of prose (an options table's "what it does") wrapped in ``.posswap-stack``, each cell
    after the first labelled with its column's name (``data-label``): extra.css shows it as a list on a phone."""

    def text(cell: str) -> str:
        return html_unescape(TAG.sub(" ", cell))

    def stack(match: re.Match) -> str:
        table = match.group(0)
        head, _, body = table.partition("</thead>")
        labels = [text(cell.group(3)).strip() for cell in CELL.finditer(head)]
        if not body or not any(len(text(c.group(3)).split()) >= PROSE_WORDS for c in CELL.finditer(body)):
            return table

        def label(row: re.Match) -> str:
            return _labelled(row.group(0), labels)

        return f'<div class="posswap-stack">{head}</thead>{ROW.sub(label, body)}</div>'

    return TABLE.sub(stack, html)


def _labelled(row: str, labels: list[str]) -> str:
    """``row`` with its cells after the first given ``data-label`` of their column."""
    count = iter(range(row.count("<td")))

    def cell(match: re.Match) -> str:
        index = next(count)
        if index == 0 or index >= len(labels):
            return match.group(0)
        return f'<td data-label="{html_escape(labels[index], quote=True)}"'

    return re.sub(r"<td(?=[ >])", cell, row)


def on_page_content(html: str, page, config, files) -> str:
    return stacked_tables(usage_words(unbroken_words(SPHINX_ROLE.sub("", html))))


def on_files(files, config):
    for picture in sorted((ROOT / "results").rglob("*.png")):
        path = picture.relative_to(ROOT).as_posix()
        if path.startswith("results/edition1/"):  # the superseded first study: no page shows it
            continue
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
