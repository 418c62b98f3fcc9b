"""embedding.context_pairs (issue 49): the recipe's own documents and questions (disjoint from the evaluation's
templates), each chunk's token span against the whole document's tokenization, the loss against a hand
computation, a recipe that trains on it, and one-line refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from test_embedding_training import recipe, text_file, tiny_st  # noqa: F401  (fixtures)

import posswap
from posswap.cli import main
from posswap.embeddings.context_task import EVALUATION, KINDS
from posswap.embeddings.training.context import TRAINING, ContextChunkLoss, context_rows

st = pytest.importorskip("sentence_transformers")


def words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def test_the_recipes_templates_share_nothing_with_the_evaluations():
    assert not set(TRAINING.haystacks) & set(EVALUATION.haystacks)
    assert not any(t.startswith("heading") for t in TRAINING.templates)  # section headings: never trained on
    evaluation_words = {w.lower() for pools in EVALUATION.words.values() for pool in pools for w in pool}
    as_tuple = lambda x: (x,) if isinstance(x, str) else tuple(x)  # noqa: E731
    for kind in KINDS:
        (names,) = TRAINING.words[kind]
        assert len(names) >= 1000 and not {w.lower() for n in names for w in n.split()} & evaluation_words
        for part in (0, 1):  # introductions, descriptions
            assert not set(as_tuple(TRAINING.intro[kind][part])) & set(as_tuple(EVALUATION.intro[kind][part]))
        ours, theirs = TRAINING.relations[kind], EVALUATION.relations[kind]
        assert not {r[0] for r in ours} & {r[0] for r in theirs} and not {r[2] for r in ours} & {r[2] for r in theirs}


def test_rows_hold_a_question_its_fact_chunk_and_every_chunks_token_span(minilm_path):
    tokenizer = st.SentenceTransformer(minilm_path, device="cpu").tokenizer
    rows = context_rows(tokenizer, [384, 512], 10, seed=0, chunk_tokens=128, group=2)
    assert context_rows(tokenizer, [384], 0, 0, 128, group=2) is None
    assert len(rows) == 10 and len(set(rows["document"])) == 10
    for query, document, label in zip(rows["query"], rows["document"], rows["label"]):
        gold, count = label[0], label[1]
        assert label[2] == -1  # a templated document has no other copy
        spans = [(label[3 + 2 * i], label[4 + 2 * i]) for i in range(count)]
        assert all(v == -1 for v in label[3 + 2 * count :])
        # Independently: the whole document's tokens, and the characters each span covers.
        encoded = tokenizer(document, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        offsets = encoded["offset_mapping"]
        assert spans[0][0] == 0 and spans[-1][1] == len(offsets) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
        fact = document[offsets[spans[gold][0]][0] : offsets[spans[gold][1] - 1][1]]
        subject = {w.lower() for w in re.findall(r"\b[A-Z]\w+", query)[1:]} - {"the"}  # the names in the question
        assert subject and not subject & words(fact), (query, fact)  # the fact's chunk does not name its subject
        assert subject <= words(document)  # the document does, elsewhere


def asked(query: str) -> tuple[str, str]:
    """(kind, relation) of a training question, by matching it against every question template."""
    found = [
        (kind, relation[0])
        for kind in KINDS
        for relation in TRAINING.relations[kind]
        if re.fullmatch(re.escape(relation[2]).replace(re.escape("{name}"), ".+"), query)
    ]
    assert len(found) == 1, query
    return found[0]


def test_each_group_of_rows_asks_one_question_of_documents_of_one_length(minilm_path):
    tokenizer = st.SentenceTransformer(minilm_path, device="cpu").tokenizer
    rows = context_rows(tokenizer, [384, 640], 27, seed=3, chunk_tokens=128, group=4)  # rounded down: 6 groups
    assert len(rows) == 24 and len(set(rows["document"])) == 24
    lengths = set()
    for g in range(6):
        label = rows["label"][4 * g : 4 * g + 4]
        assert len({asked(q) for q in rows["query"][4 * g : 4 * g + 4]}) == 1  # one kind, one question
        assert len({n[1] for n in label}) == 1  # one length: as many chunks in each document
        lengths.add(label[0][1])
    assert lengths == {3, 5}  # both lengths, in groups of their own


def test_the_trainer_batches_the_context_groups_whole_and_nothing_else():
    import datasets
    from sentence_transformers.base.sampler import NoDuplicatesBatchSampler

    from posswap.embeddings.training.batches import ContextBatchSampler, context_batch_sampler
    from posswap.embeddings.training.context import GROUPED

    grouped = datasets.Dataset.from_dict(
        {"query": [str(i) for i in range(12)]}, info=datasets.DatasetInfo(description=GROUPED)
    )
    sampler = context_batch_sampler(grouped, batch_size=4, drop_last=True, seed=5)
    assert isinstance(sampler, ContextBatchSampler) and len(sampler) == 3
    batches = list(sampler)
    assert sorted(map(tuple, batches)) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    sampler.set_epoch(1)
    orders = {tuple(b[0] for b in batches), tuple(b[0] for b in sampler)}
    assert len(orders) == 2  # another order in another epoch (one of 3! orders: seed 5 gives another)
    plain = datasets.Dataset.from_dict({"query": ["a", "b", "c", "d"]})
    assert isinstance(context_batch_sampler(plain, batch_size=2, drop_last=True, seed=0), NoDuplicatesBatchSampler)


def test_the_loss_is_a_ranking_over_every_chunk_of_the_batch(tiny_st):  # noqa: F811
    model = posswap.patch(st.SentenceTransformer(str(tiny_st), device="cpu"), posswap.InterpolateConfig(512, "stride"))
    rows = context_rows(model.tokenizer, [200], 3, seed=1, chunk_tokens=64, group=3)
    labels = torch.tensor(rows["label"])
    loss = ContextChunkLoss(model, scale=20.0)
    with torch.no_grad():
        got = loss([model.preprocess(rows["query"]), model.preprocess(rows["document"])], labels)
        queries = model.encode(rows["query"], convert_to_tensor=True)
        chunks, gold = [], []
        for document, label in zip(rows["document"], labels.tolist()):
            tokens = model.encode([document], output_value="token_embeddings")[0][1:-1]  # no [CLS], [SEP]
            spans = [(label[3 + 2 * i], label[4 + 2 * i]) for i in range(label[1])]
            gold.append(len(chunks) + label[0])
            chunks += [tokens[a:b].mean(0) for a, b in spans]
        scores = F.normalize(queries, dim=-1) @ F.normalize(torch.stack(chunks), dim=-1).T
        expected = F.cross_entropy(20.0 * scores, torch.tensor(gold))
    assert float(got) == pytest.approx(float(expected), abs=1e-5)


def test_an_embedding_recipe_with_context_pairs_trains_on_both(tiny_st, text_file, tmp_path):  # noqa: F811
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"].update(context_pairs=8, context_lengths=[192], context_chunk_tokens=64)
    spec["train"]["max_steps"] = 4  # 2 batches of pairs, 2 of context documents
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log] == [1, 2, 3, 4]
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["embedding"]["context_pairs"] == 8


@pytest.mark.parametrize(
    "change, message",
    [
        ({"context_pairs": -1}, "embedding.context_pairs must be a whole number of texts >= 0"),
        ({"context_pairs": 4, "context_lengths": [100]}, "embedding.context_lengths entry 100 holds fewer than three"),
        ({"context_pairs": 4, "context_lengths": [1024]}, "embedding.context_lengths entry 1024 is longer than"),
        ({"context_pairs": 4}, "embedding.context_pairs: no entry of embedding.document_lengths holds three chunks"),
        ({"context_chunk_tokens": 0}, "embedding.context_chunk_tokens must be a positive"),
    ],
)
def test_bad_context_values_are_one_line_and_write_nothing(tiny_st, text_file, tmp_path, capsys, change, message):  # noqa: F811
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"].update(change)
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in last, last
    assert not Path(tmp_path / "run").exists()
