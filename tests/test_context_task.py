"""The contextual chunk retrieval task (issue 49): its construction (no fact chunk names its subject, distances
from one chunk to the document's length, chunks within budget), the scores against hand computations, the stock
model's chunks at chance among the fact chunks, and one-line refusals."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from posswap import cli
from posswap.embeddings.context_retrieval import _ndcg, _tie_share, evaluate_context
from posswap.embeddings.context_task import build_context_task

st = pytest.importorskip("sentence_transformers")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "context"


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(minilm_path)


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


@pytest.mark.parametrize("length", [512, 4096])
def test_no_fact_chunk_names_its_subject_and_distances_span_the_document(tokenizer, length):
    task = build_context_task(tokenizer, length, 40, seed=3)
    for d, pieces in enumerate(task.chunks):
        name = words(task.subjects[d]) - {"the"}
        assert name <= words(pieces[task.naming_chunks[d]])  # named in one chunk
        assert len(tokenizer("".join(pieces), verbose=False)["input_ids"]) <= length
        assert all(len(tokenizer(p, verbose=False)["input_ids"]) <= 128 for p in pieces)
    for q in task.queries:
        fact = task.chunks[q.document][q.chunk]
        assert not words(task.subjects[q.document]) - {"the"} & words(fact), (q, fact)
        assert q.distance == q.chunk - task.naming_chunks[q.document] >= 1
        assert words(task.subjects[q.document]) - {"the"} <= words(q.query)
    distances = [q.distance for q in task.queries]
    count = len(task.chunks[0])
    assert min(distances) == 1 and max(distances) >= count // 2
    assert {q.template for q in task.queries} == {
        "intro-pronoun",
        "intro-description",
        "heading-pronoun",
        "heading-description",
    }


def test_the_task_is_the_same_for_a_seed_and_another_for_another(tokenizer):
    one, again = build_context_task(tokenizer, 512, 8, 0), build_context_task(tokenizer, 512, 8, 0)
    assert one.fingerprint() == again.fingerprint()
    assert build_context_task(tokenizer, 512, 8, 1).fingerprint() != one.fingerprint()


def test_the_committed_figures_scored_the_documents_the_task_builds_today(tokenizer):
    """A change to the task's construction (for a recipe's own templates, say) must leave the evaluation's documents
    as the committed results scored them: their fingerprints, written when they were run."""
    committed = json.loads((RESULTS / "minilm-late-2k-seed0" / "context" / "context.json").read_text())["settings"]
    assert build_context_task(tokenizer, 512, 100, 0).fingerprint() == committed["fingerprints"]["512"]


def test_tie_share_and_ndcg_against_their_formulas():
    scores = torch.tensor([0.1, 0.9, 0.9, 0.5, 0.9])
    assert _tie_share(scores, 1) == pytest.approx(1 / 3) and _tie_share(scores, 3) == 0
    assert _ndcg(scores, 3) == pytest.approx(1 / math.log2(5))  # three above it: rank 4
    assert _ndcg(scores, 2) == pytest.approx(sum(1 / math.log2(r + 1) for r in (1, 2, 3)) / 3)
    assert _ndcg(torch.arange(20.0), 0) == 0  # rank 20: past 10


def test_stock_chunks_are_at_chance_among_the_fact_chunks_and_one_vector_ties(minilm_path):
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    results = evaluate_context({"minilm": stock}, [384], documents=40, progress=False)
    assert list(results.rows) == ["minilm chunks", "minilm"]
    chunks = results.rows["minilm chunks"]
    chance = results.settings["chance"]["fact_accuracy"][0]
    assert chance == pytest.approx(1 / 10)
    # A chunk read alone cannot tell whose fact it is: chance, within three standard errors.
    assert abs(chunks.fact_accuracy[0] - chance) <= 3 * math.sqrt(chance * (1 - chance) / 80)
    # One vector per document: every chunk of a document ties, so at most one in its (three) chunks.
    assert results.rows["minilm"].accuracy[0] <= 1 / 3 + 1e-9
    # Every row is scored over the task's own chunks: one hit per question, the same candidates for each.
    assert results.settings["chunks"]["384"] == 3 * 40
    assert all(len(row.hits[0]) == 80 for row in results.rows.values())


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lengths", "256"], "lengths: 256 tokens hold fewer than three chunks of 128"),
        (["--documents", "3"], "documents must be a whole number from 8 to"),
        (["--chunk-tokens", "8"], "chunk_tokens must be a whole number of tokens from 16 to 512; got 8."),
        (["--haystack", "kjv"], "--haystack: the context task reads its own two held-out haystacks; leave it out."),
        (["--chunk-tokens", "64", "--task", "passkey-retrieval"], "--chunk-tokens applies to --task context-retrieval"),
    ],
)
def test_bad_context_flags_are_one_line_before_any_model_loads(tmp_path, capsys, argv, message):
    out = tmp_path / "eval"
    code = cli.main(["eval", "no/such-model", "--task", "context-retrieval", "--out", str(out), *argv])
    assert code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"posswap eval: error: {message}"), last
    assert not out.exists()


def test_a_document_past_the_models_length_gets_its_encode_vector_from_the_late_pass(minilm_path, monkeypatch):
    """The one-vector row of a document the model reads in windows is encode's vector (cut at the model's
    length), taken from the late chunks' first window rather than a second read: the same hits as encode."""
    import posswap
    from posswap.embeddings import context_retrieval

    stock = st.SentenceTransformer(minilm_path, device="cpu")
    stock.max_seq_length = 128  # small lengths keep the test fast: the long model reads 256 of 320 tokens
    long = posswap.patch(st.SentenceTransformer(minilm_path, device="cpu"), posswap.AlibiConfig(max_length=512))
    long.max_seq_length = 256
    models = {"minilm": stock, "long": long}
    task = build_context_task(long.tokenizer, 320, 8, 0, 64)
    _, documents = context_retrieval._row_vectors(long, "late-chunk-max", task, 8, None)
    # the vectors themselves: a row's hits barely move when a document's one vector is slightly off
    torch.testing.assert_close(
        torch.stack(documents), long.encode(task.documents, convert_to_tensor=True), atol=1e-5, rtol=0
    )
    fast = evaluate_context(models, [320], documents=8, chunk_tokens=64, progress=False)
    reads = []
    encode = context_retrieval._encode
    monkeypatch.setattr(
        context_retrieval, "_encode", lambda m, texts, b: reads.append(len(texts)) or encode(m, texts, b)
    )
    cut = context_retrieval.late_chunks_and_documents
    monkeypatch.setattr(
        context_retrieval, "late_chunks_and_documents", lambda *a, **k: (cut(*a, **k)[0], [None] * len(a[1]))
    )
    # The same task again, the one-vector row read by encode.
    again = evaluate_context(models, [320], documents=8, chunk_tokens=64, progress=False)
    assert 8 in reads  # encode read the long model's 8 documents: the reference is independent of the late pass
    assert fast.rows["long"].hits == again.rows["long"].hits
    assert fast.rows["long"].accuracy == again.rows["long"].accuracy
    assert fast.rows["long late chunks"].hits == again.rows["long late chunks"].hits
