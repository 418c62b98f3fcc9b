"""The natural-reference task and embedding.context_source (issue 63): a real passage in two copies with two
people's invented names swapped (a she and a he, mentioned about as often), a fact chunk that names nobody and whose
pronouns are of one gender (the same words in both copies), each fact asked once a name and answered by different
copies; oracles that read which names a document holds, its most frequent name, the nearest name before the chunk
or which name is the pair's he at chance (or near it), one that knows whom the pronouns mean right; the gender rule on a handmade text; the source
texts kept apart (training never reads Persuasion, the evaluation reads nothing else), the scorer against a reference
computed here, and one-line refusals."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from test_embedding_training import recipe, text_file, tiny_st  # noqa: F401  (fixtures)

import posswap
from posswap import cli
from posswap.cli import main
from posswap.data import read_document
from posswap.embeddings import natural_context
from posswap.embeddings.context_retrieval import ContextRow, _score_into, _settings, evaluate_context
from posswap.embeddings.context_task import FIRST, LAST
from posswap.embeddings.natural_context import COPIES, PRONOUNS, build_natural_task, genders, read_novel
from posswap.embeddings.training.context import NATURAL_TRAINING, ContextChunkLoss, context_rows

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
    """relation -> its queries: one per name, both asked about the same chunk."""
    found: dict[str, list] = {}
    for q in task.queries:
        found.setdefault(q.relation, []).append(q)
    return found


def pronoun_genders(text: str) -> set[str]:
    return {PRONOUNS[w] for w in re.findall(r"[a-z]+", text.lower()) if w in PRONOUNS}


def names_in(text: str, invented) -> frozenset[str]:
    return frozenset(n for n in invented if n.lower() in words(text))


def named_back(text: str, passage, copy: int) -> str:
    """A copy's text with each invented name put back to the person it stands for in that copy."""
    back = {passage.name(i, copy): person for i, person in enumerate(passage.cast)}
    return re.sub(rf"\b(?:{'|'.join(passage.invented)})\b", lambda m: back[m[0]], text)


def test_the_gender_rule_on_a_handmade_text():
    sentences = (
        ["Mr Brown came in.", "Brown sat down."]  # a title of one gender: he
        + ["Jane said that she would go."] * 5  # untitled: the first pronoun after the name, five times she
        + ["Pat said that he would go.", "Pat said that she would stay."] * 3  # 3 against 3: none
        + ["Mr Green came.", "Mrs Green came."] * 2  # titles of both genders: a family, none
        + ["Miss Kit came."]
        + ["Kit said that he would go."] * 6  # the votes disagree: none
        + ["Lou said she came."] * 4  # four pronouns: too few, none
    )
    found = genders(sentences, {"Brown", "Jane", "Pat", "Green", "Kit", "Lou"})
    assert found == {"Brown": "he", "Jane": "she"}
    novel = read_novel("persuasion")
    assert novel.genders["Anne"] == "she" and novel.genders["Wentworth"] == "he"
    assert "Elliot" not in novel.genders and "Charles" not in novel.genders  # a family's name; Mrs Charles Musgrove


def test_two_copies_swap_a_she_and_a_he_and_the_fact_chunk_names_nobody(tokenizer):
    novel = read_novel("persuasion")
    for seed in range(4):
        passage = natural_context._passage(tokenizer, random.Random(f"test{seed}"), novel, 8, 126, FIRST, 2, Counter())
        cast, invented = passage.cast, passage.invented
        assert [novel.genders[p] for p in cast] == ["she", "he"] and len(set(invented)) == COPIES == 2
        assert max(passage.counts) <= 2 * min(passage.counts) and min(passage.counts) >= 1
        documents = ["".join(pieces) for pieces in passage.pieces]
        assert {names_in(d, invented) for d in documents} == {frozenset(invented)}  # the same names in both copies
        assert len(set(documents)) == 2  # yet the copies differ: who is called what
        for document in documents:
            assert not {w.lower() for w in cast} & words(document)
        assert len({named_back(d, passage, c) for c, d in enumerate(documents)}) == 1  # a swap, nothing else
        for fact in passage.facts:
            texts = {pieces[fact.chunk] for pieces in passage.pieces}
            assert len(texts) == 1  # word for word the same in both copies
            (text,) = texts
            assert not names_in(text, invented) and not {w.lower() for w in cast} & words(text)
            assert not set(re.findall(r"\b[A-Z][a-z]+\b", text)) & novel.names  # nobody named at all
            assert pronoun_genders(text) == {novel.genders[cast[fact.subject]]}  # pronouns of one gender only
            before = "".join(passage.pieces[0][: fact.chunk])
            named = [w for w in re.findall(r"\b[A-Z][a-z]+\b", before) if w in set(invented) | novel.people]
            nearest = cast[invented.index(named[-1])] if named[-1] in invented else named[-1]  # copy 0: A is X
            assert nearest == cast[fact.subject if fact.nearest == "subject" else 1 - fact.subject]
            assert fact.sentence in text


def test_the_evaluation_reads_persuasion_alone_and_asks_each_fact_once_a_name(tokenizer):
    task = build_natural_task(tokenizer, 1024, 16, seed=0)
    persuasion, training = flat("persuasion"), [flat(n) for n in NATURAL_TRAINING.haystacks]
    assert len(task.chunks) == 16 and task.queries
    for q in task.queries:
        fact = task.chunks[q.document][q.chunk]
        name, sentence = q.query.split(": ", 1)
        assert name in FIRST and sentence in fact and q.template in ("nearest-subject", "nearest-other")
        for s in SPLIT.split(" ".join(fact.split())):
            assert s in persuasion and not any(s in t for t in training if len(s) > 40)
    for queries in groups(task).values():
        assert len(queries) == 2
        a, b = queries
        assert a.document // 2 == b.document // 2 and a.document != b.document  # the two copies, one answer each
        assert a.chunk == b.chunk and a.template == b.template
        assert task.chunks[a.document][a.chunk] == task.chunks[b.document][b.chunk]
        names = {q.query.split(": ")[0] for q in queries}
        assert len(names) == 2 and len({q.query.split(": ", 1)[1] for q in queries}) == 1
        for q in queries:  # both names stand in both copies, neither in the fact chunk
            assert {n.lower() for n in names} <= words(task.documents[q.document])
            assert not {n.lower() for n in names} & words(task.chunks[q.document][q.chunk])
    for pieces in task.chunks:
        assert len(tokenizer("".join(pieces), verbose=False)["input_ids"]) <= 1024
        assert all(len(tokenizer(p, verbose=False)["input_ids"]) <= 128 for p in pieces)
    assert build_natural_task(tokenizer, 1024, 16, 0).fingerprint() == task.fingerprint()
    assert build_natural_task(tokenizer, 1024, 16, 1).fingerprint() != task.fingerprint()


def test_training_rows_never_read_persuasion_and_hold_both_copies_in_a_group(tokenizer):
    assert "persuasion" not in NATURAL_TRAINING.haystacks
    assert not {n.lower() for n in NATURAL_TRAINING.names} & {w.lower() for w in FIRST + LAST}
    rows = context_rows(tokenizer, [512], 8, seed=0, chunk_tokens=128, group=4, source="natural")
    persuasion = flat("persuasion")
    for g in range(2):
        label, documents, queries = (rows[c][4 * g : 4 * g + 4] for c in ("label", "document", "query"))
        for pair in ((0, 1), (2, 3)):  # a passage's two copies, side by side in the batch
            names = [queries[i].split(": ")[0] for i in pair]
            assert len(set(names)) == 2 and len({queries[i].split(": ", 1)[1] for i in pair}) == 1
            assert len({documents[i] for i in pair}) == 2
            facts = set()
            for i in pair:
                assert names[pair.index(i)] in NATURAL_TRAINING.names
                assert {n.lower() for n in names} <= words(documents[i])  # both names in both copies
                encoded = tokenizer(documents[i], add_special_tokens=False, return_offsets_mapping=True, verbose=False)
                row = label[i]
                start, end = row[3 + 2 * row[0]], row[4 + 2 * row[0]]
                other = pair[1 - pair.index(i)]
                assert row[2] == other and row[0] == label[other][0]  # its other copy: that row, the same chunk
                facts.add(documents[i][encoded["offset_mapping"][start][0] : encoded["offset_mapping"][end - 1][1]])
            (fact,) = facts  # the same chunk text in both copies
            assert not {n.lower() for n in names} & words(fact) and len(pronoun_genders(fact)) == 1
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


def test_oracles_that_ignore_whom_the_pronouns_mean_are_at_chance_and_one_that_knows_is_right(tokenizer):
    task = build_natural_task(tokenizer, 512, 120, seed=3)
    every = sorted({q.query.split(": ")[0] for q in task.queries})
    onehot = lambda names: torch.tensor([float(n in names) for n in every]) + 1e-3  # noqa: E731  (never all zero)

    def score(vector_of) -> float:
        chunks = [torch.stack([vector_of(d, c) for c in range(len(task.chunks[d]))]) for d in range(len(task.chunks))]
        queries = torch.stack([onehot({q.query.split(": ")[0]}) for q in task.queries])
        row = ContextRow(None)
        _score_into(row, queries, chunks, task)
        assert row.fact_accuracy[0] == pytest.approx(reference_fact_accuracy(task, queries, chunks))
        return row.fact_accuracy[0]

    def found(text: str) -> list[str]:
        return [w for w in re.findall(r"\b[A-Z][a-z]+\b", text) if w in every]

    def most_frequent(d, c):
        counts = Counter(found(task.documents[d]))
        return onehot({n for n in counts if counts[n] == max(counts.values())})

    def nearest(d, c):
        before = found("".join(task.chunks[d][:c]))
        return onehot({before[-1]} if before else set())

    def subject(d, c):  # the pair's person of the chunk's pronoun gender, by its name in this copy
        she = task.subjects[d]  # the pair's she in copy d
        he = next(n for n in set(found(task.documents[d])) if n != she)
        gender = pronoun_genders(task.chunks[d][c])
        return onehot({she} if gender == {"she"} else {he} if gender == {"he"} else set())

    queries = len(task.queries)
    assert queries >= 100
    assert score(lambda d, c: onehot(set(found(task.documents[d])))) == 0.5  # which names: a tie, always
    assert score(nearest) == pytest.approx(0.5, abs=0.15)  # balanced by construction, within a lead of 2 facts
    assert score(most_frequent) == pytest.approx(0.5, abs=0.1)  # facts about the more mentioned held even
    assert score(subject) == 1.0


@pytest.mark.parametrize("length, documents, seed", [(512, 120, 3), (512, 40, 0), (1024, 40, 0), (2048, 40, 0)])
def test_the_gender_oracle_is_at_chance_and_she_and_he_facts_are_even(tokenizer, length, documents, seed):
    """The rule "answer the copy in which the query's name is the pair's he" scores the share of facts about the he:
    the task holds she-facts and he-facts within one of each other, so it is at chance."""
    task = build_natural_task(tokenizer, length, documents, seed)
    right = 0
    for q in task.queries:
        name = q.query.split(": ")[0]
        first = q.document - q.document % COPIES
        he = [d for d in range(first, first + COPIES) if task.subjects[d] != name]  # the copy where it is the he
        assert len(he) == 1 and name in {task.subjects[d] for d in range(first, first + COPIES)}
        right += q.document == he[0]
    assert len(task.queries) >= 40
    assert right / len(task.queries) == pytest.approx(0.5, abs=0.1)
    facts = Counter()
    for queries in groups(task).values():
        (gender,) = {frozenset(pronoun_genders(task.chunks[q.document][q.chunk])) for q in queries}
        (gender,) = gender
        facts[gender] += 1
    assert abs(facts["she"] - facts["he"]) <= 1 and facts["she"] + facts["he"] == len(task.queries) // 2


def test_stock_chunks_are_at_chance_among_the_copies(minilm_path):
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    results = evaluate_context({"minilm": stock}, [512], 16, progress=False, task="natural-context-retrieval")
    chunks = results.rows["minilm chunks"]
    assert chunks.fact_accuracy[0] == 0.5  # the fact chunk is the same words in both copies: a tie, always
    table = results.table("fact_accuracy")
    assert "natural-reference retrieval" in table and "nearest name: the other" in table
    assert sum(results.settings["nearest"]["512"].values()) == len(chunks.fact_hits[0])


@pytest.mark.parametrize("margin", [None, 0.05])
def test_an_embedding_recipe_trains_on_natural_context_pairs(tiny_st, text_file, tmp_path, monkeypatch, margin):  # noqa: F811
    seen = []  # the margins the context loss ran with: the recipe's key reaches the loss
    forward = ContextChunkLoss.forward
    monkeypatch.setattr(
        ContextChunkLoss, "forward", lambda self, *a: seen.append(self.copy_margin) or forward(self, *a)
    )
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"].update(context_pairs=8, context_lengths=[192], context_chunk_tokens=64, context_source="natural")
    spec["embedding"]["context_copy_margin"] = margin
    spec["train"]["max_steps"] = 4
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    written = json.loads((tmp_path / "run" / "recipe.json").read_text())["embedding"]
    assert written["context_source"] == "natural" and written["context_copy_margin"] == margin
    assert seen and set(seen) == {margin}


def reference_copy_margin_loss(queries, chunks, gold, twins, scale, margin):
    """Per row, plainly: the cross-entropy over every chunk but the other copy's fact chunk, plus scale x the
    hinge on the cosine gap to that chunk; averaged."""
    total = 0.0
    for r, q in enumerate(queries):
        other = gold[twins[r]]
        cos = [F.cosine_similarity(q, c, dim=0) for c in chunks]
        kept = [i for i in range(len(chunks)) if i != other]
        logits = torch.stack([scale * cos[i] for i in kept])
        total += -torch.log_softmax(logits, 0)[kept.index(gold[r])] + scale * max(
            0.0, margin - (cos[gold[r]] - cos[other])
        )
    return float(total) / len(queries)


def test_the_copy_margin_leaves_the_other_copy_out_of_the_ranking_and_asks_for_the_margin(tiny_st):  # noqa: F811
    model = posswap.patch(st.SentenceTransformer(str(tiny_st), device="cpu"), posswap.InterpolateConfig(512, "stride"))
    rows = context_rows(model.tokenizer, [192], 4, seed=2, chunk_tokens=64, group=4, source="natural")
    labels = torch.tensor(rows["label"])
    with torch.no_grad():
        queries = model.encode(rows["query"], convert_to_tensor=True)
        chunks, gold = [], []
        for document, label in zip(rows["document"], labels.tolist()):
            tokens = model.encode([document], output_value="token_embeddings")[0][1:-1]  # no [CLS], [SEP]
            gold.append(len(chunks) + label[0])
            chunks += [tokens[label[3 + 2 * i] : label[4 + 2 * i]].mean(0) for i in range(label[1])]
        features = [model.preprocess(rows["query"]), model.preprocess(rows["document"])]
        twins = labels[:, 2].tolist()
        for margin in (0.05, 1.0):  # 1.0: every hinge active
            got = float(ContextChunkLoss(model, 20.0, margin)(features, labels))
            assert got == pytest.approx(
                reference_copy_margin_loss(queries, chunks, gold, twins, 20.0, margin), abs=1e-4
            )
        plain = F.cross_entropy(
            20.0 * F.normalize(queries, dim=-1) @ F.normalize(torch.stack(chunks), dim=-1).T, torch.tensor(gold)
        )
        assert float(ContextChunkLoss(model, 20.0)(features, labels)) == pytest.approx(float(plain), abs=1e-5)
        templated = labels.clone()
        templated[:, 2] = -1  # rows without another copy: the margin changes nothing
        assert float(ContextChunkLoss(model, 20.0, 0.05)(features, templated)) == pytest.approx(float(plain), abs=1e-5)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"context_pairs": 8, "context_source": "novels"}, "embedding.context_source must be one of 'templates'"),
        ({"context_source": "natural"}, "embedding.context_source (natural) says what the context pairs are"),
        ({"context_pairs": 8, "context_copy_margin": 0.05}, "embedding.context_copy_margin (0.05) applies to natural"),
        (
            {"context_pairs": 8, "context_source": "both", "context_copy_margin": 0},
            "embedding.context_copy_margin must be a number",
        ),
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


@pytest.mark.parametrize(
    "documents,message",
    [("2", "documents must be a whole number from 4 to 400"), ("5", "documents counts the copies of each passage (2)")],
)
def test_bad_natural_flags_are_one_line_before_any_model_loads(tmp_path, capsys, documents, message):
    out = tmp_path / "eval"
    code = cli.main(
        ["eval", "no/such-model", "--task", "natural-context-retrieval", "--documents", documents, "--out", str(out)]
    )
    assert code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]
    assert not out.exists()
