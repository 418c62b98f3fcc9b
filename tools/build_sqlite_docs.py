"""Build posswap/data/corpus/sqlite-docs.txt.gz: technical prose a recipe may train on (the Python docs may not).

Source: the SQLite documentation's prose pages (how SQLite commits, locks, plans queries, stores types), from the
Debian package ``sqlite3-doc``. Licence: public domain (https://www.sqlite.org/copyright.html). The Python
documentation stays the evaluation's held-out technical domain; this is a second technical text, by other
authors about another program, so that a recipe's context documents need not all be novels.

    apt-get download sqlite3-doc && dpkg-deb -x sqlite3-doc_*.deb deb
    python tools/build_sqlite_docs.py deb/usr/share/doc/sqlite3

Paragraphs, list items and headings become paragraphs of plain text; the menu, scripts, tables and code blocks go
(a context document is cut at sentence ends: a table or a listing has none).
"""

from __future__ import annotations

import gzip
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

# Prose pages, in this order; the language reference (lang_*) and the C API pages are mostly syntax.
PAGES = (
    "about",
    "whentouse",
    "atomiccommit",
    "lockingv3",
    "wal",
    "isolation",
    "tempfiles",
    "howtocorrupt",
    "queryplanner",
    "optoverview",
    "datatype3",
    "foreignkeys",
    "quirks",
    "testing",
    "lang_transaction",
    "asyncvfs",
    "arch",
    "cintro",
    "vfs",
    "malloc",
    "limits",
    "np1queryprob",
    "sharedcache",
    "withoutrowid",
    "rowidtable",
    "flextypegood",
    "serverless",
    "selfcontained",
    "transactional",
    "vtab",
    "fileformat2",
    "fts5",
    "rtree",
)
BLOCKS = {"p", "li", "h1", "h2", "h3", "h4", "h5", "dd", "dt", "blockquote", "div", "ul", "ol", "dl", "br"}
SKIPPED = {"script", "style", "table", "pre", "title", "form", "select"}
OUT = Path(__file__).resolve().parents[1] / "posswap" / "data" / "corpus" / "sqlite-docs.txt.gz"


class ProseParser(HTMLParser):
    """The page's text as paragraphs: one per block element, outside the menu (div.nosearch) and SKIPPED."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self.words: list[str] = []  # the current paragraph's text pieces
        self.skipping: list[str] = []  # open tags whose content is dropped, innermost last
        self.divs: list[bool] = []  # per open div: whether it is the menu

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "div":
            self.divs.append("nosearch" in (dict(attrs).get("class") or ""))
        if tag in SKIPPED:
            self.skipping.append(tag)
        if tag in BLOCKS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if tag in BLOCKS:
            self._flush()
        if tag == "div" and self.divs:
            self.divs.pop()
        if self.skipping and self.skipping[-1] == tag:
            self.skipping.pop()

    def handle_data(self, data: str) -> None:
        if not self.skipping and not any(self.divs):
            self.words.append(data)

    def close(self) -> None:
        super().close()
        self._flush()  # the page's last paragraph, when no block tag ends it

    def _flush(self) -> None:
        text = " ".join("".join(self.words).split())  # inline tags split the text, not its words
        self.words = []
        if re.search(r"[A-Za-z]{3}", text):  # not a stray bullet, number or symbol
            self.paragraphs.append(text)


def prose(html: str) -> str:
    parser = ProseParser()
    parser.feed(html)
    parser.close()
    return "\n\n".join(parser.paragraphs) + "\n"


def main(pages: Path) -> None:
    texts = [prose((pages / f"{page}.html").read_text(encoding="utf-8")) for page in PAGES]
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:  # mtime 0: the same bytes on every rebuild
        f.write("\n".join(texts).encode("utf-8"))
    print(f"{OUT}: {len(PAGES)} pages, {sum(len(t) for t in texts) / 1e6:.2f} MB of text")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1], "about.html").is_file():
        sys.exit("usage: python tools/build_sqlite_docs.py DIR  (DIR holds the sqlite3-doc pages, e.g. about.html)")
    main(Path(sys.argv[1]))
