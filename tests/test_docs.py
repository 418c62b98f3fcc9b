"""The front page and the documentation site: the README stays a short front page with its two quick-start commands,
every public name is in the API reference, every method has its page, and the study pages are exactly what the
results JSON gives (regenerated here and compared byte for byte)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import posswap
from posswap.cli import main
from posswap.registry import METHODS
from posswap.study.copying_report import copying_table
from posswap.study.docs_report import COPYING_PAGES, pages, write_pages

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "results"

# CI's and a newcomer's contract: these two lines must stay in the README exactly as they are.
QUICK_START = (
    'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e ".[demo]" && '
    "posswap demo",
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && "
    'pip install -e ".[test]" && python -m pytest -q',
)


def test_the_readme_is_a_front_page_with_its_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the front page keeps to 200 (move the rest to docs/)"
    for command in QUICK_START:
        assert command in lines, f"README.md lost or changed the quick-start command: {command}"


def test_the_readme_quotes_the_demo_run_time_from_its_json():
    demo = json.loads((RESULTS / "demo" / "demo.json").read_text())
    quoted = f"the main job ({demo['wall_seconds'] / 60:.1f} min on {demo['cpus']} cores)"
    assert quoted in README.read_text(), f"README.md should say {quoted!r}, as results/demo/demo.json gives"


@pytest.mark.parametrize("page", [README, ROOT / "CONTRIBUTING.md"], ids=lambda p: p.name)
def test_every_relative_link_of_the_front_pages_exists(page):
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
        if "://" not in target:
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


def test_every_public_name_is_in_the_api_reference():
    # '::: posswap.NAME', or the object's own module path where a module shares the name (posswap.export.export);
    # the method configs are written in at build time (posswap:method-configs)
    page = load_hooks().on_page_markdown((DOCS / "reference.md").read_text(), *[None] * 3)
    documented = set(re.findall(r"^::: posswap(?:\.\w+)*\.(\w+)$", page, re.MULTILINE))
    missing = sorted(set(posswap.__all__) - documented)
    assert not missing, f"docs/reference.md lacks '::: posswap.NAME' for {missing}"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_has_a_page_with_its_options_table(method):
    page = DOCS / "methods" / f"{method}.md"
    assert page.is_file(), f"method {method!r} has no page docs/methods/{method}.md"
    marker = f"<!-- posswap:options {METHODS[method].config_class.__name__} -->"
    assert marker in page.read_text(), f"docs/methods/{method}.md lacks {marker}"
    assert {method: f"methods/{method}.md"} in load_hooks().method_pages(), f"the nav lacks methods/{method}.md"


def test_the_study_pages_are_what_the_results_json_gives(tmp_path):
    written = write_pages(RESULTS, tmp_path)
    assert written, "no study page was generated from results/"
    committed = sorted(p.name for p in (DOCS / "study").glob("*.md") if p.name != "index.md")
    assert sorted(p.name for p in written) == committed, "docs/study/ holds a page that results/ does not generate"
    for path in written:
        relative = path.relative_to(tmp_path)
        assert path.read_bytes() == (DOCS / relative).read_bytes(), (
            f"docs/{relative} differs from what results/ gives: run posswap study --report-only --docs docs/"
        )


@pytest.mark.parametrize("page", sorted(COPYING_PAGES))
def test_the_copying_pages_quote_the_copying_tables_as_their_json_gives_them(page):
    folder = COPYING_PAGES[page][0]
    text = (DOCS / "study" / f"{page}.md").read_text()
    for line in copying_table(json.loads((RESULTS / folder / "copying.json").read_text())):
        assert line in text, f"docs/study/{page}.md lacks or changed this line of results/{folder}/copying.json: {line}"
    command = COPYING_PAGES[page][2]
    assert command.startswith("posswap study --preset ") and f"Reproduce: `{command}`" in text


def test_a_changed_number_in_the_json_changes_the_page(tmp_path):
    # The pages come from the JSON, not from a copy of them: a drifted number shows up in the page.
    copy = tmp_path / "results" / "mini"
    copy.mkdir(parents=True)
    found = json.loads((RESULTS / "mini" / "copying.json").read_text())
    found["original"]["drop"][0] = 1.2345
    (copy / "copying.json").write_text(json.dumps(found))
    text = pages(tmp_path / "results")["study/mini.md"]
    assert "| original (untrained) | 1.23 |" in text and text != (DOCS / "study" / "mini.md").read_text()


def test_the_docs_flag_writes_the_pages_and_needs_report_only(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["study", "--docs", str(tmp_path)]) == 2
    assert "--report-only" in capsys.readouterr().err and not any(tmp_path.iterdir())
    assert main(["study", "--report-only", "--docs", str(tmp_path), "--out", str(tmp_path / "none")]) == 2
    assert "no results folder" in capsys.readouterr().err
    assert main(["study", "--report-only", "--docs", str(tmp_path)]) == 0
    assert (tmp_path / "study" / "copying.md").read_bytes() == (DOCS / "study" / "copying.md").read_bytes()
    # A page posswap did not write is not replaced: refused, nothing written.
    (tmp_path / "study" / "mini.md").write_text("my own notes\n")
    (tmp_path / "study" / "copying.md").unlink()
    assert main(["study", "--report-only", "--docs", str(tmp_path)]) == 2
    assert "mini.md was not written by posswap study" in capsys.readouterr().err
    assert (tmp_path / "study" / "mini.md").read_text() == "my own notes\n"
    assert not (tmp_path / "study" / "copying.md").exists()


def load_hooks():
    pytest.importorskip("mkdocs")  # the dev extra
    import importlib.util

    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "tools" / "mkdocs_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def test_the_site_hooks_fill_options_from_the_config_help():
    hooks = load_hooks()
    table = hooks.on_page_markdown(
        "x\n<!-- posswap:options RopeConfig -->\ny `<!-- posswap:options No -->`", *[None] * 3
    )
    for field in ("max_length", "theta", "rope_type", "rotary_dim"):
        help_text = posswap.RopeConfig.__dataclass_fields__[field].metadata["help"]
        assert f"| `{field}` |" in table and help_text in table
    assert table.endswith("y `<!-- posswap:options No -->`")  # a marker inside a line is text, not a directive
    assert "usage: posswap patch" in hooks.cli_help("patch")
    for name in ("patch", "posswap.no_such_module.X"):
        with pytest.raises(ValueError, match="no config dataclass"):
            hooks.options_table(name)
    # mkdocstrings prints a docstring's Sphinx role as text before the code: the page shows only the code
    html = "see :func:<code>posswap.patch</code> and :class:<code>X</code>; a:b:<code>c</code> stays"
    assert hooks.on_page_content(html, *[None] * 3) == hooks.unbroken_words(
        "see <code>posswap.patch</code> and <code>X</code>; a:b:<code>c</code> stays"
    )


def test_the_site_shows_a_table_codes_escaped_pipe_as_a_pipe():
    """GitHub needs `\\|i - j\\|` in a table cell; Python-Markdown keeps code pipes in the cell and would print the
    backslashes. Outside tables and outside code nothing changes."""
    hooks = load_hooks()
    page = "| a | symmetric `\\|i - j\\|` and a\\|b |\ntext `\\|x\\|`"
    assert hooks.unescape_table_code(page) == "| a | symmetric `|i - j|` and a\\|b |\ntext `\\|x\\|`"
    index = (ROOT / "docs" / "methods" / "index.md").read_text()
    assert "`\\|i - j\\|`" in index and "`|i - j|`" in hooks.on_page_markdown(index, *[None] * 3)


def test_the_site_keeps_each_word_of_inline_code_on_one_line():
    hooks = load_hooks()
    word = '<span class="posswap-word">{}</span>'.format
    html = "pass <code>--overwrite</code>, <code>--set a=1 b=2</code>; <pre><span></span><code>--out x</code></pre>"
    assert hooks.on_page_content(html, *[None] * 3) == (
        f"pass <code>{word('--overwrite')}</code>, <code>{word('--set')} {word('a=1')} {word('b=2')}</code>; "
        "<pre><span></span><code>--out x</code></pre>"
    )
    long = "a" * 31  # longer than a phone's line may need to break: left to the theme
    assert hooks.unbroken_words(f"<code>{long}</code>") == f"<code>{long}</code>"
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert ".md-typeset .posswap-word {\n  white-space: nowrap;" in css


def test_the_generated_pages_are_what_the_generator_writes():
    """The method tables (README, docs/methods/index.md: the registry and each method's page) and the results' tables
    and verdicts (README, docs/embeddings.md, docs/onnx.md, docs/late-chunking.md: results/) are what
    ``python -m posswap.cli.generate --write`` writes: a number typed by hand, a method added without its row, or a
    JSON changed without the generator, fails."""
    from posswap.cli import pages

    written = pages.pages()
    assert {path.relative_to(ROOT).as_posix() for path, _ in written} == {*pages.METHOD_TABLES, *pages.RESULT_PAGES}
    for name in ("passkey", "speed"):
        assert f"<!-- posswap:embeddings-{name} -->" in (ROOT / "docs" / "embeddings.md").read_text()
    for path in (ROOT / "README.md", ROOT / "docs" / "late-chunking.md"):
        assert "-front -->\n|" in path.read_text() or "<!-- posswap:context-summary -->\n|" in path.read_text(), path
    stale = [str(path.relative_to(ROOT)) for path, render in written if render() != path.read_text()]
    assert not stale, f"stale generated blocks in {', '.join(stale)}: run python -m posswap.cli.generate --write"


def test_every_registered_method_has_its_row_in_both_method_tables():
    from posswap.cli import pages

    rows = pages.method_rows()
    assert [row["name"] for row in rows if "-" in (row["what"], row["table"], row["pick"])] == []
    for name in pages.METHOD_TABLES:
        text = (ROOT / name).read_text()
        assert all(f"[`{row['name']}`](" in text for row in rows), name


def test_no_readme_table_is_wider_than_nine_columns():
    """The front page is read on a phone: a wider table belongs in docs/."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("|"):
            assert line.strip().count("|") - 1 <= 9, line[:120]


def test_one_description_of_posswap_everywhere():
    """pyproject's description, the site's and the package docstring's say the same thing in the same words."""
    import tomllib

    import posswap

    described = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["description"]
    site = next(line for line in (ROOT / "mkdocs.yml").read_text().splitlines() if line.startswith("site_description:"))
    docstring = " ".join(posswap.__doc__.split()).removeprefix("posswap: ")
    assert site.removeprefix("site_description: ") == described
    assert docstring == described[0].lower() + described[1:]


def test_the_cli_page_is_the_parsers():
    """docs/cli.md's synopsis is generated from the parsers (posswap:usage), and every flag its text names is one a
    parser takes: a renamed or removed flag fails here, not on a reader's screen."""
    hooks = load_hooks()
    page = (DOCS / "cli.md").read_text()
    assert "<!-- posswap:usage -->" in page and "```bash" not in page
    usage = hooks.cli_usage()
    assert (
        "posswap export [-h] --out OUT [--overwrite] [--format {native,onnx}] [--int8] [--debug] MODEL" in usage
        and "posswap train [-h] [--list]" in usage
    )
    flags = {flag for parser in hooks.command_parsers().values() for a in parser._actions for flag in a.option_strings}
    refused = {"--rope-typ"}  # the page's example of an abbreviation the parser refuses
    unknown = sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", page)) - flags - refused)
    assert not unknown, f"docs/cli.md names flags no parser takes: {', '.join(unknown)}"


MACHINE_PATH = re.compile(r"(?<![\w./-])/(?:tmp|work|home|root|scratch|mnt)/\S*")


def test_no_page_shows_a_path_of_the_machine_that_made_it():
    """Issue 62: the commands the results JSON records ran in scratch folders (``/tmp/w29c/run-seed0``); the pages
    show them relative to the clone or as ``out/NAME`` (posswap.files.shown_command), and nothing typed names one."""
    from posswap.files import shown_command

    pages = [README, *sorted(DOCS.rglob("*.md"))]
    found = [f"{page.relative_to(ROOT)}: {hit}" for page in pages for hit in MACHINE_PATH.findall(page.read_text())]
    assert not found, "machine paths in the docs:\n" + "\n".join(found[:10])
    command = "posswap train x --set train.output_dir=/tmp/w29c/run-seed0 --out /root/out/gpu.json"
    assert shown_command(command) == "posswap train x --set train.output_dir=out/run-seed0 --out out/gpu.json"
    assert shown_command(f"posswap eval {ROOT / 'out' / 'm'} recipes/a/tmp/b") == "posswap eval out/m recipes/a/tmp/b"


def test_a_clone_outside_the_known_scratch_folders_is_shown_relative(monkeypatch):
    """CI clones under /check/work/main, a place the machine-path pattern does not list: the clone's own paths are
    still shown relative to it (the docs test failed there and only there)."""
    from posswap import files

    monkeypatch.setattr(files, "CLONE", Path("/check/work/main"))
    shown = files.shown_command("cd /check/work/main && posswap eval /check/work/main/out/m")
    assert shown == "cd . && posswap eval out/m"


def test_the_cli_synopsis_is_a_line_a_command_that_wraps_between_words():
    """Issue 62: argparse's usage, wrapped at a terminal's width, was wrapped again by a phone (ragged). The page
    holds a line a command; each word is kept whole (no break at a flag's hyphens), a long list of choices breaks
    after its commas."""
    hooks = load_hooks()
    usage = hooks.cli_usage()
    lines = usage.splitlines()[1:-1]
    commands = [name for name in hooks.command_parsers() if name]
    assert usage.startswith("```{.text .posswap-usage}") and [line.split()[1] for line in lines] == commands
    html = f'<div class="posswap-usage highlight"><pre><span></span><code>{lines[0]}</code></pre></div>'
    shown = hooks.usage_words(html)
    assert '<span class="posswap-word">[--max-length</span>' in shown
    assert ',<wbr><span class="posswap-word">t5-bias</span>' in shown and re.sub(r"<[^>]+>", "", shown) == lines[0]
