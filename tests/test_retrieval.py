"""Long-document retrieval (LongEmbed's passkey and needle tasks): documents built exactly (length, depth bucket,
seed), scores checked against hand-built encoders (an oracle that reads the needle gets 1.0, one that reads only
the first tokens finds only the shallow needles, a constant one gets chance), bad inputs refused in one line,
and ``posswap eval --task passkey-retrieval`` on the real MiniLM at tiny sizes."""

from __future__ import annotations

import json
import re

import pytest
import torch
from transformers import AutoTokenizer

from posswap import cli
from posswap.data import GPT2_TOKENIZER_DIR
from posswap.embeddings.retrieval import RetrievalResults, build_tasks, evaluate_retrieval, retrieval_hits
from posswap.embeddings.retrieval_tasks import FACTS, FIRST_NAMES, SURNAMES

LENGTHS = (128, 256)
DOCUMENTS = 10


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    return AutoTokenizer.from_pretrained(minilm_path)


class Oracle:
    """Embeds a text as the one-hot vector of the needle it holds (a passkey's owner, a fact), read with regular
    expressions and the fact table, not with the builder's own lists; reads only the first ``limit`` tokens."""

    names = [f"{first} {last}" for first in FIRST_NAMES for last in SURNAMES]

    def __init__(self, tokenizer=None, limit: int | None = None):
        self.tokenizer, self.limit = tokenizer, limit

    def _index(self, text: str) -> int | None:
        if self.limit is not None:
            ids = self.tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][: self.limit - 2]
            text = self.tokenizer.decode(ids)
        # "NAME's pass key is" in a document (BERT's decode may space the apostrophe), "pass key for NAME" in a query
        found = re.search(r"([a-z]+ [a-z]+) ?' ?s pass key is|pass key for ([a-z]+ [a-z]+)", text, re.I)
        if found:
            name = (found.group(1) or found.group(2)).lower()
            return next(i for i, n in enumerate(self.names) if n.lower() == name)
        for i, (fact, question) in enumerate(FACTS):
            if question in text or fact.lower().rstrip(".") in text.lower():
                return len(self.names) + i
        return None

    def encode(self, texts, batch_size=8, convert_to_tensor=True, show_progress_bar=False):
        vectors = torch.zeros(len(texts), len(self.names) + len(FACTS) + 1)
        for row, text in enumerate(texts):
            index = self._index(text)
            vectors[row, -1 if index is None else index] = 1.0
        return vectors


class Constant:
    def encode(self, texts, batch_size=8, convert_to_tensor=True, show_progress_bar=False):
        return torch.ones(len(texts), 8)


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_same_seed_same_documents_other_seed_other_documents(tokenizer, task):
    first = build_tasks(task, tokenizer, LENGTHS, DOCUMENTS, seed=0)
    again = build_tasks(task, tokenizer, LENGTHS, DOCUMENTS, seed=0)
    other = build_tasks(task, tokenizer, LENGTHS, DOCUMENTS, seed=1)
    assert [t.documents for t in first] == [t.documents for t in again]
    assert [t.queries for t in first] == [t.queries for t in again]
    assert [t.fingerprint() for t in first] == [t.fingerprint() for t in again]
    assert all(a.documents != b.documents and a.queries != b.queries for a, b in zip(first, other))


@pytest.mark.parametrize("tokenizer_dir", ["minilm", "gpt2"])
@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_documents_have_the_length_and_the_needle_its_depth_bucket(minilm_path, tokenizer_dir, task):
    tokenizer = AutoTokenizer.from_pretrained(minilm_path if tokenizer_dir == "minilm" else GPT2_TOKENIZER_DIR)
    specials = len(tokenizer("a")["input_ids"]) - len(tokenizer("a", add_special_tokens=False)["input_ids"])
    for built in build_tasks(task, tokenizer, (160, 512), DOCUMENTS, seed=3):
        assert len(set(built.documents)) == DOCUMENTS
        for text, needle, bucket in zip(built.documents, built.needles, built.buckets):
            assert len(tokenizer(text, verbose=False)["input_ids"]) == built.length
            assert text.count(needle) == 1
            haystack = built.length - specials - len(tokenizer(" " + needle, add_special_tokens=False)["input_ids"])
            before = text[: text.index(needle)].rstrip()
            depth = len(tokenizer(before, add_special_tokens=False)["input_ids"]) / haystack if before else 0.0
            assert min(int(depth * 5), 4) == bucket, (depth, bucket)
        assert built.buckets == [i % 5 for i in range(DOCUMENTS)]


@pytest.mark.parametrize("task", ["passkey", "needle"])
def test_an_oracle_that_reads_the_needle_finds_every_document(tokenizer, task):
    results = evaluate_retrieval({"oracle": Oracle()}, task, LENGTHS, DOCUMENTS, tokenizer=tokenizer, progress=False)
    oracle = results.models["oracle"]
    assert oracle.accuracy == [1.0, 1.0] and oracle.stderr == [0.0, 0.0]
    assert oracle.by_depth == [[1.0] * 5, [1.0] * 5]


def test_an_oracle_that_reads_128_tokens_finds_only_the_shallow_needles(tokenizer):
    """At 512 tokens a reader of the first 128 sees the needles of the first bucket (depth < 0.2) and none of
    the last three (depth >= 0.4): the depth buckets are where the documents say. A query whose needle it did
    not see scores 0 against every document, a 20-way tie: 1/20."""
    short = Oracle(tokenizer, limit=128)
    results = evaluate_retrieval({"short": short}, "passkey", [512], 20, tokenizer=tokenizer, progress=False)
    by_depth = results.models["short"].by_depth[0]
    assert by_depth[0] == 1.0 and by_depth[2:] == pytest.approx([1 / 20] * 3), by_depth


def test_a_constant_encoder_scores_chance(tokenizer):
    """Every document ties at the top, so each query counts 1/documents (ties share the credit)."""
    results = evaluate_retrieval({"constant": Constant()}, "needle", LENGTHS, 8, tokenizer=tokenizer, progress=False)
    constant = results.models["constant"]
    assert constant.accuracy == pytest.approx([1 / 8, 1 / 8])
    assert all(hit == pytest.approx(1 / 8) for hits in constant.hits for hit in hits)


def test_hits_against_a_hand_built_case():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    documents = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    # query 0 ties documents 0 and 1 (half), query 1 is nearest document 2 (miss), query 2 finds document 2.
    assert retrieval_hits(queries, documents) == pytest.approx([0.5, 0.0, 1.0])


def test_results_round_trip_table_and_files(tokenizer, tmp_path):
    models = {"oracle": Oracle(), "constant": Constant()}
    results = evaluate_retrieval(models, "passkey", LENGTHS, 4, seed=5, tokenizer=tokenizer, progress=False)
    p = 1 / 4
    assert results.models["constant"].stderr == pytest.approx([(p * (1 - p) / 4) ** 0.5] * 2)
    results.save(tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["retrieval.json", "retrieval.png"]
    assert RetrievalResults.load(tmp_path).to_dict() == json.loads(json.dumps(results.to_dict()))
    table = results.table().splitlines()
    assert table[0] == "| tokens | oracle | constant |"
    assert table[2] == "| 128 | 1.00 ± 0.00 | 0.25 ± 0.22 |"


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"task": "haystack"}, "task"),
        ({"lengths": [8, 256]}, "lengths"),
        ({"lengths": "256,512"}, "lengths"),
        ({"documents": 1}, "documents"),
        ({"task": "needle", "documents": 101}, "documents"),
        ({"batch_size": 0}, "batch_size"),
        ({"haystack": "nowhere"}, "haystack"),
    ],
)
def test_bad_input_is_one_line_naming_the_argument(tokenizer, kwargs, named):
    arguments = {"task": "passkey", "lengths": LENGTHS, "documents": 4, "tokenizer": tokenizer, "progress": False}
    with pytest.raises(ValueError, match=named) as error:
        evaluate_retrieval({"oracle": Oracle()}, **{**arguments, **kwargs})
    assert "\n" not in str(error.value)


def test_cli_on_the_shipped_minilm_writes_retrieval_json(tmp_path, capsys):
    out = tmp_path / "report"
    argv = ["eval", "posswap:minilm", "--task", "passkey-retrieval", "--lengths", "128", "256"]
    assert cli.main(argv + ["--documents", "4", "--out", str(out)]) == 0
    data = json.loads((out / "retrieval.json").read_text())
    assert data["task"] == "passkey" and data["lengths"] == [128, 256] and data["documents"] == 4
    assert data["models"]["minilm"]["limit"] == 256  # the shipped model reads 256 tokens
    assert data["settings"]["tokenizer"] == "the tokenizer of minilm"  # no path of this machine in the results
    assert len(data["models"]["minilm"]["accuracy"]) == 2 and (out / "retrieval.png").is_file()
    assert "| tokens | minilm |" in capsys.readouterr().out


@pytest.mark.parametrize("flag,named", [("--documents", "documents"), ("--batch-size", "batch_size")])
def test_cli_zero_is_refused_not_replaced_by_the_default(tmp_path, capsys, flag, named):
    out = tmp_path / "report"
    argv = ["eval", "posswap:minilm", "--task", "passkey-retrieval", "--lengths", "128", flag, "0", "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1, err
    assert not out.exists()
