"""Chunk baselines and late chunking (issue 29): what a user with a vector database does today, and what a long
model adds. Hand-built encoders give scores known in advance; late chunks are checked against the transformer's
token outputs pooled by hand."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
import transformers

import posswap
from posswap import cli
from posswap.embeddings.chunking import split_into_chunks
from posswap.embeddings.retrieval import build_tasks, evaluate_retrieval, retrieval_hits
from posswap.embeddings.retrieval_tasks import FIRST_NAMES, SURNAMES

st = pytest.importorskip("sentence_transformers")
NAMES = sorted(set(FIRST_NAMES) | set(SURNAMES))


class NameEncoder:
    """Reads the first ``max_seq_length`` tokens of a text and marks which of the passkey task's names it saw: a
    chunk holding the needle matches its query, every other chunk is the zero vector."""

    def __init__(self, tokenizer, max_seq_length: int):
        self.tokenizer, self.max_seq_length = tokenizer, max_seq_length

    def encode(self, texts, **kwargs):
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_seq_length, verbose=False)["input_ids"]
        seen = [set(re.findall(r"[a-z]+", self.tokenizer.decode(row))) for row in ids]
        return torch.tensor([[float(name.lower() in words) for name in NAMES] for words in seen])


class ConstantEncoder(NameEncoder):
    def encode(self, texts, **kwargs):
        return torch.ones(len(texts), 3)


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return transformers.AutoTokenizer.from_pretrained(minilm_path)


def test_chunk_max_finds_the_needle_in_any_chunk(tokenizer):
    results = evaluate_retrieval(
        {"names": NameEncoder(tokenizer, 128)},
        "passkey",
        [128, 1024],
        documents=20,
        baselines=["chunk-mean", "chunk-max"],
        progress=False,
    )
    assert list(results.models) == ["names", "names chunk-mean@128", "names chunk-max@128"]
    assert results.models["names chunk-max@128"].accuracy == [1.0, 1.0]
    assert results.models["names chunk-mean@128"].accuracy == [1.0, 1.0]  # the other chunks are zero vectors
    # Read whole at 128; truncated at 1024, where only the needles in the first 128 tokens are seen.
    assert results.models["names"].accuracy[0] == 1.0 and results.models["names"].accuracy[1] < 0.5
    assert results.models["names chunk-max@128"].limit == 128


def test_a_constant_encoder_scores_chance_in_every_column(tokenizer):
    results = evaluate_retrieval(
        {"constant": ConstantEncoder(tokenizer, 128)},
        "passkey",
        [512],
        documents=10,
        baselines=["chunk-mean", "chunk-max"],
        progress=False,
    )
    assert list(results.models) == ["constant", "constant chunk-mean@128", "constant chunk-max@128"]
    for model in results.models.values():  # a tie of all 10 at the top: 1/10 to each query
        assert model.accuracy == pytest.approx([0.1], abs=1e-7)


def test_chunks_are_slices_of_the_text_that_tokenize_to_its_tokens(tokenizer):
    text = "Anne Elliot walked to Uppercross; the morning was fine. " * 40
    pieces = split_into_chunks(tokenizer, text, 64)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(pieces) == math.ceil(len(ids) / 62)  # 64 tokens less [CLS] and [SEP]
    again = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces]
    assert all(len(a) <= 62 for a in again) and sum(again, []) == ids
    assert all(p in text for p in pieces)


@pytest.fixture(scope="module")
def long_model(minilm_path):
    return posswap.patch(st.SentenceTransformer(minilm_path, device="cpu"), posswap.AlibiConfig(max_length=1024))


def test_late_chunks_of_a_short_text_is_its_embedding(long_model):
    text = "A short sentence about Anne Elliot."
    (chunks,) = posswap.late_chunks(long_model, [text], chunk_tokens=256)
    torch.testing.assert_close(chunks, long_model.encode([text], convert_to_tensor=True), atol=1e-6, rtol=0)


def test_late_chunks_pool_the_whole_documents_token_outputs(long_model):
    text = "Captain Wentworth wrote the letter at the table while Anne spoke with Harville. " * 30
    tokens = long_model.tokenizer(text, return_tensors="pt")
    count = tokens["input_ids"].shape[1]
    assert 300 < count <= 1024
    with torch.no_grad():
        outputs = long_model[0].auto_model(**tokens).last_hidden_state[0]  # the whole text read once
    expected = torch.stack([F.normalize(outputs[i : i + 100].mean(0), dim=-1) for i in range(0, count, 100)])
    chunks, short = posswap.late_chunks(long_model, [text, "short"], chunk_tokens=100)  # batched with padding
    assert chunks.shape == (math.ceil(count / 100), 384) and short.shape == (1, 384)
    torch.testing.assert_close(chunks, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"texts": "one text"}, "texts must be a list of strings; for one text, pass [text]."),
        ({"chunk_tokens": 0}, "chunk_tokens must be a positive whole number of tokens; got 0."),
    ],
)
def test_late_chunks_bad_arguments_are_one_line(long_model, kwargs, message):
    with pytest.raises(ValueError) as refused:
        posswap.late_chunks(long_model, **{"texts": ["a"], **kwargs})
    assert str(refused.value) == message


def test_late_chunk_max_is_a_column_of_every_longer_model(minilm_path, long_model):
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    results = evaluate_retrieval(
        {"minilm": stock, "alibi": long_model}, "passkey", [256], documents=5, baselines=["late-chunk-max"]
    )
    assert list(results.models) == ["minilm", "alibi", "alibi late-chunk-max@256"]
    # Within one chunk late chunking is the model's own embedding: the same hits.
    assert results.models["alibi late-chunk-max@256"].hits == results.models["alibi"].hits
    with pytest.raises(ValueError, match="late-chunk-max needs a model that reads more than the first model's 256"):
        evaluate_retrieval({"minilm": stock}, "passkey", [256], documents=5, baselines=["late-chunk-max"])


def test_an_unknown_baseline_is_one_line_before_any_model_loads(tmp_path, capsys):
    out = tmp_path / "eval"
    code = cli.main(
        ["eval", "no/such-model", "--task", "passkey-retrieval", "--baselines", "chunk-best", "--out", str(out)]
    )
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "posswap eval: error: baselines must be distinct names of chunk-mean, chunk-max, late-chunk-max; "
        "got ['chunk-best']."
    )
    assert not out.exists()


def test_each_text_is_embedded_once_per_model_however_many_columns_read_it(tokenizer):
    class Counting(NameEncoder):
        def encode(self, texts, **kwargs):
            self.seen = getattr(self, "seen", 0) + len(texts)
            return super().encode(texts, **kwargs)

    encoder = Counting(tokenizer, 128)
    evaluate_retrieval(
        {"names": encoder}, "passkey", [512], documents=10, baselines=["chunk-mean", "chunk-max"], progress=False
    )
    chunks = 10 * math.ceil((512 - 2) / 126)  # each 512-token document in chunks of 126 word pieces
    assert encoder.seen == 10 + 10 + chunks  # queries, documents, chunks: once each


def test_the_one_vector_column_read_with_the_late_chunks_is_encode_of_each_document(minilm_path, long_model):
    """The one-vector column of a model with late chunks comes from their pass (each document read once): its hits
    are those of encode, computed here independently."""
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    results = evaluate_retrieval(
        {"minilm": stock, "alibi": long_model}, "needle", [512], documents=20, baselines=["late-chunk-max"]
    )
    (task,) = build_tasks("needle", stock.tokenizer, [512], 20, 0)
    queries = long_model.encode(task.queries, convert_to_tensor=True)
    documents = long_model.encode(task.documents, convert_to_tensor=True)
    assert results.models["alibi"].hits[0] == retrieval_hits(queries, documents)
