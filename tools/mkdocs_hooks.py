"""mkdocs hooks (``hooks:`` in mkdocs.yml): what the site shows that the code already knows, filled in at build time so
it cannot go stale.

- ``<!-- posswap:options RopeConfig -->`` becomes the options table of that config dataclass, from its fields' ``help``
  metadata (the text ``posswap patch --help`` prints); a dotted path names a dataclass elsewhere in posswap.
- ``<!-- posswap:cli patch -->`` becomes ``posswap patch --help`` (``<!-- posswap:cli -->``: ``posswap --help``).
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
MARKER = re.compile(r"^<!-- posswap:(options|cli|include)(?: ([\w.-]+))? -->$", re.MULTILINE)  # alone on a line


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


def cli_help(command: str | None) -> str:
    """``posswap [COMMAND] --help`` as argparse prints it, at a fixed width so the page does not depend on a terminal."""
    from posswap.cli import build_parser

    parser = build_parser()
    if command is not None:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if command not in commands.choices:
            raise ValueError(f"posswap:cli {command}: posswap has no such command ({', '.join(commands.choices)}).")
        parser = commands.choices[command]
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"  # argparse reads the width when it formats; put back for the rest of mkdocs
    try:
        text = parser.format_help().rstrip()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "```text\n" + text + "\n```"


# The files of the repository root that are pages of the site too (the page holds only their include marker).
INCLUDED = {"CONTRIBUTING.md": "contributing.md", "CHANGELOG.md": "changelog.md"}


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    def fill(match: re.Match) -> str:
        kind, name = match.groups()
        return {"options": options_table, "cli": cli_help, "include": include}[kind](name)

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


def on_page_content(html: str, page, config, files) -> str:
    return unbroken_words(SPHINX_ROLE.sub("", html))


def on_files(files, config):
    for picture in sorted((ROOT / "results").rglob("*.png")):
        path = picture.relative_to(ROOT).as_posix()
        if path.startswith("results/edition1/"):  # the superseded first study: no page shows it
            continue
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files
