"""The natural-reference task and embedding.context_source (issue 63): a real passage in copies that hold the same
invented names, rotated among its people from copy to copy, a fact chunk that names nobody (the same words in every
copy), a query naming the main character by its name in its copy, an oracle that knows only which names a document
holds at chance, the source texts kept apart (training never reads Persuasion, the evaluation reads nothing else), the
scorer against a reference computed here, and one-line refusals."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
import yaml
from test_embedding_training import recipe, text_file, tiny_st  # noqa: F401  (fixtures)

from posswap import cli
from posswap.cli import main
from posswap.data import read_document
from posswap.embeddings import natural_context
from posswap.embeddings.context_retrieval import ContextRow, _score_into, _settings, evaluate_context
from posswap.embeddings.context_task import FIRST, LAST
from posswap.embeddings.natural_context import COPIES, build_natural_task, read_novel
from posswap.embeddings.training.context import NATURAL_TRAINING, context_rows

st = pytest.importorskip("sentence_transformers")
SPLIT = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(minilm_path)


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def flat(name: str) -> str:
    return " ".join(read_document(name).split())


def groups(task) -> dict[str, list]:
    """relation -> its queries: one per copy of a passage, all asked about the same chunk."""
    found: dict[str, list] = {}
    for q in task.queries:
        found.setdefault(q.relation, []).append(q)
    return found


def names_in(text: str, invented) -> frozenset[str]:
    return frozenset(n for n in invented if n.lower() in words(text))


def named_back(text: str, passage, copy: int) -> str:
    """A copy's text with each invented name put back to the person it stands for in that copy."""
    invented, k = passage.invented, len(passage.cast)
    back = {invented[(i + copy) % k]: person for i, person in enumerate(passage.cast)}
    return re.sub(rf"\b(?:{'|'.join(invented)})\b", lambda m: back[m[0]], text)


def test_copies_hold_the_same_names_rotated_among_the_people_and_the_fact_chunk_names_nobody(tokenizer):
    novel = read_novel("persuasion")
    passage = natural_context._passage(tokenizer, random.Random("test"), novel, 8, 126, FIRST, 4, 2, least=4)
    cast, invented, k = passage.cast, passage.invented, len(passage.cast)
    assert k == 4 and len(set(cast)) == 4 and set(cast) <= novel.people and passage.original == cast[0]
    assert len(set(invented)) == 4 and len(passage.pieces) == 4
    assert passage.names == [invented[c] for c in range(k)]  # the main character (person 0) in copy c
    documents = ["".join(pieces) for pieces in passage.pieces]
    assert {names_in(d, invented) for d in documents} == {frozenset(invented)}  # the same set in every copy
    assert len(set(documents)) == k  # yet the copies differ: who is called what
    for document in documents:
        assert not {w.lower() for w in cast} & words(document)  # no name of the cast is left
    # Named back by its own assignment, every copy is the same text: the assignment is the only difference.
    assert len({named_back(d, passage, c) for c, d in enumerate(documents)}) == 1
    # Each person's name differs from copy to copy, a rotation: where copy 0 says invented[j], copy c says
    # invented[(j + c) % k], occurrence by occurrence.
    pattern = rf"\b(?:{'|'.join(invented)})\b"
    first = [invented.index(n) for n in re.findall(pattern, documents[0])]
    assert first and set(first) == set(range(k))
    for c, document in enumerate(documents):
        assert [invented.index(n) for n in re.findall(pattern, document)] == [(j + c) % k for j in first]
    for chunk, distance, sentence in passage.facts:
        texts = {pieces[chunk] for pieces in passage.pieces}
        assert len(texts) == 1  # word for word the same in every copy
        (text,) = texts
        assert not names_in(text, invented) and not {w.lower() for w in cast} & words(text)
        assert not set(re.findall(r"\b[A-Z][a-z]+\b", text)) & novel.people  # nobody else named either
        assert sentence in text and distance == min(abs(chunk - m) for m in passage.mentions) >= 1


def test_a_passage_with_fewer_people_than_copies_makes_as_many_copies_as_people(tokenizer):
    novel = read_novel("persuasion")
    rng = random.Random("fewer")
    sizes = {len(natural_context._passage(tokenizer, rng, novel, 4, 126, FIRST, 6, 1).pieces) for _ in range(12)}
    assert min(sizes) >= 2 and max(sizes) <= 6 and len(sizes) > 1
    chunks = [[("Anne walked on.", True)], [("She was tired.", True)], [("It was late.", True)]]
    assert natural_context._cast(chunks, frozenset({"Anne"}), 4) == ["Anne"]  # one person: refused (fewer than 2)


def test_fact_chunks_about_the_main_character_are_asked_first():
    chunks = [[("Anne walked in.", False)], [("She sat.", True)], [("Mary came.", True)], [("She spoke.", True)]]
    about = natural_context._about(chunks, frozenset({"Anne", "Mary"}))
    assert about == ["Anne", "Anne", "Mary", "Mary"]  # the nearest person named before the chunk (or in it)
    distance = {1: 1, 3: 2}
    preferred = {c for c in distance if about[c] == "Anne"}
    assert natural_context._far_first(random.Random(0), [1, 3], distance, 1, preferred) == [1]  # not the farther
    assert natural_context._far_first(random.Random(0), [1, 3], distance, 1) == [3]


@pytest.mark.parametrize("length", [512, 2048])
def test_the_evaluation_reads_persuasion_alone_and_asks_each_copy_by_its_name(tokenizer, length):
    task = build_natural_task(tokenizer, length, 16, seed=0)
    persuasion, training = flat("persuasion"), [flat(n) for n in NATURAL_TRAINING.haystacks]
    assert len(task.chunks) == 16 and task.queries
    for q in task.queries:
        name = task.subjects[q.document]
        assert name in FIRST and q.query.startswith(f"{name}: ")
        assert name.lower() in words(task.documents[q.document])
        fact = task.chunks[q.document][q.chunk]
        assert q.query.removeprefix(f"{name}: ") in fact
        for sentence in SPLIT.split(" ".join(fact.split())):
            assert sentence in persuasion and not any(sentence in t for t in training if len(sentence) > 40)
    for queries in groups(task).values():
        assert len(queries) == COPIES and len({task.chunks[q.document][q.chunk] for q in queries}) == 1
        names = {task.subjects[q.document] for q in queries}
        assert len(names) == COPIES
        for q in queries:  # every copy's query name stands in every copy's document
            assert {n.lower() for n in names} <= words(task.documents[q.document])
            assert not {n.lower() for n in names} & words(task.chunks[q.document][q.chunk])
    for pieces in task.chunks:
        assert len(tokenizer("".join(pieces), verbose=False)["input_ids"]) <= length
        assert all(len(tokenizer(p, verbose=False)["input_ids"]) <= 128 for p in pieces)
    assert build_natural_task(tokenizer, length, 16, 0).fingerprint() == task.fingerprint()
    assert build_natural_task(tokenizer, length, 16, 1).fingerprint() != task.fingerprint()


def test_training_rows_never_read_persuasion_and_name_copies_apart_from_the_evaluation(tokenizer):
    assert "persuasion" not in NATURAL_TRAINING.haystacks
    assert not {n.lower() for n in NATURAL_TRAINING.names} & {w.lower() for w in FIRST + LAST}
    rows = context_rows(tokenizer, [512], 8, seed=0, chunk_tokens=128, group=4, source="natural")
    persuasion = flat("persuasion")
    for g in range(2):
        label, documents, queries = (rows[c][4 * g : 4 * g + 4] for c in ("label", "document", "query"))
        names = [q.split(": ")[0] for q in queries]
        assert len(set(names)) == 4 and len(set(documents)) == 4 and len({q.split(": ", 1)[1] for q in queries}) == 1
        facts = set()
        for name, document, row in zip(names, documents, label):
            assert name in NATURAL_TRAINING.names and name.lower() in words(document)
            assert {n.lower() for n in names} <= words(document)  # the same names in every copy, assigned apart
            encoded = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
            start, end = row[2 + 2 * row[0]], row[3 + 2 * row[0]]
            facts.add(document[encoded["offset_mapping"][start][0] : encoded["offset_mapping"][end - 1][1]])
        (fact,) = facts  # the same chunk text in the group's four copies
        assert not {n.lower() for n in names} & words(fact)
        assert not any(s in persuasion for s in SPLIT.split(" ".join(fact.split())) if len(s) > 40)


def reference_fact_accuracy(task, queries: torch.Tensor, chunks: list[torch.Tensor]) -> float:
    """Accuracy at 1 among the copies' fact chunks, ties shared, computed plainly."""
    total = 0.0
    for i, q in enumerate(task.queries):
        same = [p for p in task.queries if p.relation == q.relation]
        scores = [torch.cosine_similarity(queries[i], chunks[p.document][p.chunk], dim=0).item() for p in same]
        top = max(scores)
        winners = [p for p, s in zip(same, scores) if s == top]
        total += (q in winners) / len(winners)
    return total / len(task.queries)


def test_the_scorer_against_a_reference_on_hand_made_vectors(tokenizer):
    task = build_natural_task(tokenizer, 512, 12, seed=2)
    generator = torch.Generator().manual_seed(0)
    passages = len(task.chunks) // COPIES
    base = [torch.randn(len(task.chunks[p * COPIES]), 16, generator=generator) for p in range(passages)]
    names = torch.randn(len(task.chunks), 16, generator=generator)  # what a copy's context adds to its chunks
    alone = [base[d // COPIES] for d in range(len(task.chunks))]  # every copy's chunks the same vectors
    read_whole = [base[d // COPIES] + 0.5 * names[d] for d in range(len(task.chunks))]
    queries = torch.stack([base[q.document // COPIES][q.chunk] + 0.5 * names[q.document] for q in task.queries])
    for chunks, expected in ((read_whole, 1.0), (alone, 1 / COPIES)):
        row = ContextRow(None)
        _score_into(row, queries, chunks, task)
        assert row.fact_accuracy[0] == pytest.approx(expected)
        assert row.fact_accuracy[0] == pytest.approx(reference_fact_accuracy(task, queries, chunks))
    noisy = [c + torch.randn(c.shape, generator=generator) for c in read_whole]
    row = ContextRow(None)
    _score_into(row, queries, noisy, task)
    assert row.fact_accuracy[0] == pytest.approx(reference_fact_accuracy(task, queries, noisy))
    settings = _settings([task], "natural-context-retrieval")
    assert settings["chance"]["fact_accuracy"] == [1 / COPIES] and settings["haystacks"] == ["persuasion"]


def test_an_oracle_that_knows_only_which_names_a_document_holds_is_at_chance(tokenizer):
    task = build_natural_task(tokenizer, 1024, 16, seed=3)
    every = sorted(set(task.subjects))
    for queries in groups(task).values():  # within a passage each copy's main character has its own name
        assert len({task.subjects[q.document] for q in queries}) == COPIES
    bag = lambda text: torch.tensor([float(n.lower() in words(text)) for n in every])  # noqa: E731
    chunks = [torch.stack([bag(task.documents[d])] * len(task.chunks[d])) for d in range(len(task.chunks))]
    queries = torch.stack([bag(q.query.split(": ")[0]) for q in task.queries])
    row = ContextRow(None)
    _score_into(row, queries, chunks, task)
    assert row.fact_accuracy[0] == pytest.approx(1 / COPIES)
    assert row.fact_accuracy[0] == pytest.approx(reference_fact_accuracy(task, queries, chunks))
    # Knowing whom the chunk is about (the main character's name in its copy) is what answers.
    knows = [torch.stack([bag(task.subjects[d])] * len(task.chunks[d])) for d in range(len(task.chunks))]
    row = ContextRow(None)
    _score_into(row, queries, knows, task)
    assert row.fact_accuracy[0] == pytest.approx(1.0)


def test_stock_chunks_are_at_chance_among_the_copies(minilm_path):
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    results = evaluate_context({"minilm": stock}, [384], 16, progress=False, task="natural-context-retrieval")
    chunks = results.rows["minilm chunks"]
    n = len(chunks.fact_hits[0])
    assert abs(chunks.fact_accuracy[0] - 1 / COPIES) <= 3 * math.sqrt(3 / 16 / n) + 1e-9
    assert "natural-reference retrieval" in results.table("fact_accuracy")


def test_an_embedding_recipe_trains_on_natural_context_pairs(tiny_st, text_file, tmp_path):  # noqa: F811
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"].update(context_pairs=8, context_lengths=[192], context_chunk_tokens=64, context_source="natural")
    spec["train"]["max_steps"] = 4
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["embedding"]["context_source"] == "natural"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"context_pairs": 8, "context_source": "novels"}, "embedding.context_source must be one of 'templates'"),
        ({"context_source": "natural"}, "embedding.context_source (natural) says what the context pairs are"),
    ],
)
def test_a_bad_context_source_is_one_line(tiny_st, text_file, tmp_path, capsys, change, message):  # noqa: F811
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"].update({"context_lengths": [192], "context_chunk_tokens": 64} | change)
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err), err
    assert not Path(tmp_path / "run").exists()


def test_bad_natural_flags_are_one_line_before_any_model_loads(tmp_path, capsys):
    out = tmp_path / "eval"
    code = cli.main(
        ["eval", "no/such-model", "--task", "natural-context-retrieval", "--documents", "4", "--out", str(out)]
    )
    assert code == 2
    assert "documents must be a whole number from 8 to 400" in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists()
