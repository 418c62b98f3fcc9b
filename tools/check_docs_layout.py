"""Check the built docs site's layout in headless Chromium at a desktop and a phone width; exit 1 on a problem.

    python tools/check_docs_layout.py                       # builds the site into a scratch folder first
    python tools/check_docs_layout.py --site site --shots shots/   # a built site; also a screenshot of each page

Each page is loaded with tools/docs_layout_probe.js added (in a copy beside it, so its links and assets resolve)
and ``chromium --dump-dom`` prints what the probe measured. A problem is: something in the article that sticks out
of it with no scroll bar to reach it (clipped by an ``overflow: hidden`` box, or spilling over the sidebar or past
the screen), a page that scrolls sideways, inline code of one word (an option name, a path) broken across two
lines, a table cell squeezed too narrow to read, code under a code block's copy button, or a table wider than the
column (on a desktop at all; on a phone by more than 1.8x: split or transpose it), a table that scrolls sideways
without showing the reader it does (the "scroll" hint and the fade at its edge: docs/javascripts/tables.js and
docs/stylesheets/extra.css), or something floating over the text (a "Back to top" button over a table's header).
Code blocks and tables a little wider than a phone's column are fine when they scroll: their count is printed. Needs
Chromium (Debian: ``apt-get install chromium``) and a few minutes; ``.ci/run`` runs it where Chromium is installed.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tools" / "docs_layout_probe.js"
REPORT = re.compile(r'<pre id="posswap-layout">(.*?)</pre>', re.DOTALL)
WIDTHS = (1280, 390)
PHONE = 600  # px: a narrower screen is a phone's
# How much wider than the column a table may be, on a phone and on a desktop: on a phone a table may scroll for a
# column or two; on a desktop every table fits.
WIDE_TABLE = {True: 1.0, False: 1.8}


def pages(site: Path) -> list[Path]:
    """Every page of the site (not the 404 page, not the search index's assets)."""
    found = sorted(p for p in site.rglob("index.html") if "assets" not in p.relative_to(site).parts)
    if not found:
        raise SystemExit(f"check_docs_layout: no pages under {site} (build the site first, or leave out --site).")
    return found


def page_name(site: Path, page: Path) -> str:
    return page.parent.relative_to(site).as_posix() or "."


def chromium(browser: str, url: str, width: int, *extra: str, height: int = 1000) -> str:
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},{height}", *extra, url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise SystemExit(f"check_docs_layout: {browser} failed on {url}: {done.stderr.strip()[-500:]}")
    return done.stdout


def measure(browser: str, page: Path, width: int) -> dict:
    """What the probe found on ``page`` at ``width`` pixels."""
    probe = page.with_name(f"layout-probe-{width}.html")
    probe.write_text(page.read_text().replace("</body>", f"<script>{PROBE.read_text()}</script></body>"))
    try:
        dom = chromium(browser, probe.as_uri(), width, "--virtual-time-budget=5000", "--dump-dom")
    finally:
        probe.unlink()
    found = REPORT.search(dom)
    if found is None:
        raise SystemExit(f"check_docs_layout: the probe reported nothing for {page} at {width} px.")
    return json.loads(html.unescape(found.group(1)))


def problems(report: dict) -> list[str]:
    lines = []
    if report["page_scrolls_sideways"]:
        lines.append("the page scrolls sideways")
    lines += [f"clipped, no scroll bar: {what}" for what in report["clipped"]]
    lines += [f"sticks out of the column: {what}" for what in report["spills"]]
    lines += [f"one word broken across lines: {word}" for word in report["broken_words"]]
    lines += [f"a column too narrow to read: {cell}" for cell in report["narrow_cells"]]
    lines += [f"code under the copy button: {code}" for code in report["code_under_button"]]
    lines += [f"a table cut off with no sign that it scrolls: {table}" for table in report["unmarked_scrolling_tables"]]
    lines += [f"floats over the text: {what}" for what in report["floating"]]
    limit = WIDE_TABLE[report["width"] > PHONE]
    lines += [
        f"a table {t['ratio']}x the column's width (at most {limit}x: split or transpose it): {t['table']}"
        for t in report["wide_tables"]
        if t["ratio"] > limit
    ]
    return lines


def build(into: Path) -> Path:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "mkdocs", "build", "-q", "--strict", "-f", str(ROOT / "mkdocs.yml")]
    subprocess.run([*command, "--site-dir", str(into)], check=True, env=env, cwd=ROOT)
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--site", type=Path, help="a built site (default: build one into a scratch folder)")
    parser.add_argument("--shots", type=Path, help="also write a full-page screenshot of each page at each width")
    parser.add_argument("--only", nargs="+", default=[], help="check only these pages (cli, study/copying, . ...)")
    parser.add_argument("--chromium", default="chromium", help="the browser to run (default: chromium)")
    args = parser.parse_args(argv)
    browser = shutil.which(args.chromium)
    if browser is None:
        raise SystemExit(f"check_docs_layout: no {args.chromium} on PATH (Debian: apt-get install chromium).")
    with tempfile.TemporaryDirectory(prefix="posswap-site-") as scratch:
        site = args.site.resolve() if args.site else build(Path(scratch))
        chosen = [page for page in pages(site) if not args.only or page_name(site, page) in args.only]
        jobs = [(page, width) for page in chosen for width in WIDTHS]
        with ThreadPoolExecutor(max_workers=2) as pool:
            reports = list(pool.map(lambda job: measure(browser, *job), jobs))
            if args.shots:
                args.shots.mkdir(parents=True, exist_ok=True)
                list(pool.map(lambda job: screenshot(browser, site, args.shots, *job), jobs))
    failed = 0
    for (page, width), report in zip(jobs, reports):
        where = f"{page_name(site, page)} at {width} px"
        found = problems(report)
        failed += bool(found)
        print(f"{'FAIL' if found else 'ok  '} {where}: {report['scroll_boxes']} boxes scroll")
        for line in found:
            print(f"     {line}")
    print(f"{len(jobs) - failed} of {len(jobs)} page views without a layout problem.")
    return 1 if failed else 0


def screenshot(browser: str, site: Path, shots: Path, page: Path, width: int) -> None:
    name = page_name(site, page).replace("/", "-").replace(".", "index")
    height = 2400 if width > 1000 else 3000
    chromium(browser, page.as_uri(), width, f"--screenshot={shots / f'{name}-{width}.png'}", height=height)


if __name__ == "__main__":
    sys.exit(main())
