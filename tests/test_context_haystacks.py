"""embedding.context_haystacks (issue 63): the texts a recipe's template context documents are cut from, checked
against the texts themselves; one-line refusals before anything is written; and tools/build_sqlite_docs.py's
HTML-to-prose on a page made in the test."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from test_context_diagnosis_band import diagnosis
from test_embedding_training import recipe, text_file, tiny_st  # noqa: F401  (fixtures)

from posswap.cli import main
from posswap.data import read_document
from posswap.embeddings.context_retrieval import _settings, accuracy_by_haystack
from posswap.embeddings.context_task import SENTENCE, build_context_task
from posswap.embeddings.report_context import haystack_block
from posswap.embeddings.training.context import TRAINING, context_rows, training_templates

st = pytest.importorskip("sentence_transformers")
ROOT = Path(__file__).resolve().parents[1]


def flat(text: str) -> str:
    return " ".join(text.split())


def sources_of(document: str, texts: dict[str, str]) -> set[str]:
    """The texts that hold the document's long sentences (the inserted template sentences are in none)."""
    found = set()
    for sentence in SENTENCE.split(flat(document)):
        if len(sentence) > 60:
            found |= {name for name, text in texts.items() if sentence in text}
    return found


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return st.SentenceTransformer(minilm_path, device="cpu").tokenizer


@pytest.fixture(scope="module")
def texts():
    return {
        name: flat(read_document(name)) for name in (*TRAINING.haystacks, "sqlite-docs", "persuasion", "python-docs")
    }


def test_accuracy_by_haystack_finds_each_querys_document_and_its_text(tokenizer, texts):
    task = build_context_task(tokenizer, 512, 12, seed=4)
    settings = _settings([task])
    truth = [sources_of(task.documents[q.document], texts) for q in task.queries]  # the text each is cut from
    assert all(len(t) == 1 for t in truth)
    hits = [float(i % 3 == 0) for i in range(len(task.queries))]  # any pattern: a share per text, by hand
    expected = {}
    for (text,), hit in zip(truth, hits):
        expected.setdefault(text, []).append(hit)
    assert accuracy_by_haystack(hits, settings) == {t: sum(h) / len(h) for t, h in expected.items()}
    assert set(expected) == {"persuasion", "python-docs"}


def test_the_haystack_table_holds_the_committed_runs_hits_split_by_hand():
    root = ROOT / "results" / "context"
    lines = haystack_block(root)
    run = root / "history" / "minilm-late-2k-steps240-seed0"
    context = json.loads((run / "context" / "context.json").read_text())
    hits = context["rows"]["model late chunks"]["hits"][context["lengths"].index(2048)]
    halves = [hits[i] for i in range(len(hits)) if i // 2 % 2 == 0], [hits[i] for i in range(len(hits)) if i // 2 % 2]
    shares = [sum(h) / len(h) for h in halves]
    assert lines[0] == "| run | persuasion | python-docs |"
    assert f"| {run.name} | {shares[0]:.2f} | {shares[1]:.2f} |" in lines, lines


def test_template_documents_are_cut_from_the_given_texts_and_by_default_from_the_novels(tokenizer, texts):
    technical = context_rows(tokenizer, [384], 6, seed=0, chunk_tokens=128, group=2, haystacks=("sqlite-docs",))
    default = context_rows(tokenizer, [384], 6, seed=0, chunk_tokens=128, group=2)
    assert [sources_of(d, texts) for d in technical["document"]] == [{"sqlite-docs"}] * 6
    assert all(sources_of(d, texts) and "sqlite-docs" not in sources_of(d, texts) for d in default["document"])


def test_an_odd_count_of_texts_gives_every_kinds_group_each_text(tokenizer, texts):
    given = ("emma", "sqlite-docs", "prideprejudice")
    rows = context_rows(tokenizer, [384], 12, seed=1, chunk_tokens=128, group=3, haystacks=given)
    for g in range(4):  # one group a kind: three documents of one kind and one question
        group = rows["document"][3 * g : 3 * g + 3]
        assert set().union(*(sources_of(d, texts) for d in group)) == set(given)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"context_haystacks": "sqlite-docs"}, "embedding.context_haystacks must be a non-empty list"),
        ({"context_haystacks": ["persuasion"]}, "entry 'persuasion' is a haystack the context task holds out"),
        ({"context_haystacks": ["python-docs"]}, "entry 'python-docs' is a haystack the context task holds out"),
        ({"context_haystacks": ["no-such-text"]}, "entry 'no-such-text' is not an embedded text; choose from:"),
        (
            {"context_haystacks": ["emma"], "context_source": "natural"},
            "embedding.context_haystacks applies to template context pairs",
        ),
        ({"context_haystacks": ["emma"], "context_pairs": 0}, "and embedding.context_pairs is 0"),
    ],
)
def test_bad_context_haystacks_are_one_line_before_anything_is_written(
    tiny_st,  # noqa: F811
    text_file,  # noqa: F811
    tmp_path,
    capsys,
    change,
    message,
):
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"].update({"context_pairs": 8, "context_lengths": [192], "context_chunk_tokens": 64} | change)
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err), err
    assert not (tmp_path / "run").exists()


def test_sqlite_pages_become_prose_without_menu_tables_or_code():
    spec = importlib.util.spec_from_file_location("build_sqlite_docs", ROOT / "tools" / "build_sqlite_docs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    page = (
        "<html><head><title>T</title><script>var x = 1;</script></head><body>"
        "<div class=nosearch><ul><li><a href='a.html'>About</a></ul></div>"
        "<h1>1. Locks</h1><p>A <a href='x.html'>shared lock</a>, held by a\n reader, blocks writers.<p>Next &amp; last."
        "<table><tr><td>Cell text here</td></tr></table><pre>SELECT 1;</pre><ul><li>An item of a list<li>7</ul>"
        "</body></html>"
    )
    paragraphs = tool.prose(page).strip().split("\n\n")
    assert paragraphs == [
        "1. Locks",
        "A shared lock, held by a reader, blocks writers.",
        "Next & last.",
        "An item of a list",
    ]
    assert not re.search(r"About|Cell|SELECT|var x", tool.prose(page))
    assert "sqlite-docs" in (ROOT / "posswap" / "data" / "corpus" / "README.md").read_text()


def test_the_diagnosis_cuts_the_recipes_documents_from_the_texts_its_run_recorded(tmp_path, tokenizer, texts):
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.json").write_text(json.dumps({"embedding": {"context_haystacks": ["sqlite-docs"]}}))
    tool = diagnosis()
    assert tool.run_haystacks(run / "model") == ("sqlite-docs",)
    lines = dict(tool.shifted_templates(training_templates(tool.run_haystacks(run / "model"))))
    ours = build_context_task(tokenizer, 384, 4, 5, 128, lines["recipe's templates and haystacks"])
    mixed = build_context_task(tokenizer, 384, 4, 5, 128, lines["recipe's, evaluation's haystacks"])
    assert [sources_of(d, texts) for d in ours.documents] == [{"sqlite-docs"}] * 4
    assert all(sources_of(d, texts) <= {"persuasion", "python-docs"} for d in mixed.documents)
    (tmp_path / "null").mkdir()
    (tmp_path / "null" / "recipe.json").write_text(json.dumps({"embedding": {"context_haystacks": None}}))
    assert tool.run_haystacks(tmp_path / "null" / "model") == TRAINING.haystacks
    assert tool.run_haystacks(tmp_path / "no-run" / "model") == TRAINING.haystacks  # a model out of its run folder
    (tmp_path / "null" / "recipe.json").write_text("[1, 2")
    with pytest.raises(SystemExit, match="is not a run's resolved recipe"):
        tool.run_haystacks(tmp_path / "null" / "model")


def test_the_diagnosis_records_the_recipes_texts_it_used(tmp_path, minilm_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "model").symlink_to(minilm_path, target_is_directory=True)
    (run / "recipe.json").write_text(json.dumps({"embedding": {"context_haystacks": ["sqlite-docs", "emma"]}}))
    out = tmp_path / "lines.json"
    diagnosis().main([str(run / "model"), "--training", "--length", "384", "--documents", "4", "--out", str(out)])
    assert "The recipe's haystacks: sqlite-docs, emma." in capsys.readouterr().out
    assert json.loads(out.read_text())["recipe_haystacks"] == ["sqlite-docs", "emma"]
