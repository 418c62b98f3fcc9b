"""Build posswap/data/corpus/python-docs.txt.gz, the study's second held-out domain: technical prose.

Source: the reStructuredText sources of the Python 3.11 documentation (*The Python Tutorial* and the
HOWTOs), from the Debian package ``python3.11-doc`` (``html/_sources/``). Licence: the Python Software
Foundation License Version 2 (the documentation's licence; the code examples are also under the Zero-Clause
BSD licence), see https://docs.python.org/3.11/license.html. No posswap training split contains it.

    apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb deb
    python tools/build_python_docs.py deb/usr/share/doc/python3.11/html/_sources

The markup is stripped to plain text (roles keep their text, directives and underlines go); code examples stay.
"""

from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

# Prose HOWTOs; the C-API ones (clinic, cporting, isolating-extensions, instrumentation) are mostly C.
HOWTOS = (
    "functional",
    "sorting",
    "unicode",
    "logging",
    "regex",
    "descriptor",
    "argparse",
    "sockets",
    "enum",
    "ipaddress",
    "urllib2",
    "curses",
    "annotations",
    "pyporting",
    "logging-cookbook",
)
ROLE = re.compile(r":[\w:.+-]+:`([^`]*)`")
TARGET = re.compile(r"\s*<[^>]*>$")
LINK = re.compile(r"`([^`<]*?)\s*<[^>]*>`_+")
UNDERLINE = re.compile(r"^\s*([=\-~*^#\"'`+.])\1{3,}\s*$")
OUT = Path(__file__).resolve().parents[1] / "posswap" / "data" / "corpus" / "python-docs.txt.gz"


def plain(rst: str) -> str:
    lines = []
    for line in rst.splitlines():
        if UNDERLINE.match(line) or line.lstrip().startswith(".. ") or re.match(r"^\s*:[\w-]+:( |$)", line):
            continue  # section underlines, directives, directive options
        line = line.replace("``", "").replace("::", ":").replace("\\", "")
        lines.append(line.rstrip())
    text = ROLE.sub(lambda m: TARGET.sub("", m.group(1)).lstrip("~!"), "\n".join(lines))  # roles may span lines
    text = re.sub(r"`([^`]+)`_+", r"\1", LINK.sub(r"\1", text))  # links keep their text
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def main(sources: Path) -> None:
    index = (sources / "tutorial" / "index.rst.txt").read_text()
    chapters = re.findall(r"^\s+(\w[\w-]*)\.rst$", index, re.M) or re.findall(r"^\s{3}(\w[\w-]*)$", index, re.M)
    files = [sources / "tutorial" / f"{c}.rst.txt" for c in chapters] + [
        sources / "howto" / f"{h}.rst.txt" for h in HOWTOS
    ]
    text = "\n\n".join(plain(f.read_text(encoding="utf-8")) for f in files if f.exists())
    with gzip.open(OUT, "wt", encoding="utf-8") as f:
        f.write(text)
    print(f"{OUT}: {len(files)} documents, {len(text.split()):,} words")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
