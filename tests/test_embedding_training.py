"""Long embeddings: the ``stride`` interpolation mode (LongEmbed's E5-Base-4k placement of the old rows), the
(passage, document) pairs, and an embedding recipe run end to end with sentence-transformers' trainer on a tiny
BERT wrapped as a SentenceTransformer (MiniLM's tokenizer)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
import tokenizers
import torch
import transformers
import yaml
from conftest import make_model, outputs, reload_and_compare, token_ids
from test_sentence_transformers import tiny_sentence_transformer

import posswap
from posswap.cli import main
from posswap.data import GPT2_TOKENIZER_DIR, read_document
from posswap.embeddings.training.data import document_pairs, tokenized_sources
from posswap.portable.posswap_functional import resample_positions, resample_table
from posswap.training.recipe import recipe_from_dict

st = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")


def stride_by_hand(table: torch.Tensor, rows: int) -> torch.Tensor:
    """Row by row: p = k*i + j reads old row i moved j/k of the way to row i + 1; past the last placed row, that row."""
    old, k = table.shape[0], rows // table.shape[0]
    out = []
    for p in range(rows):
        i, j = divmod(p, k)
        out.append(table[i] + (table[i + 1] - table[i]) * (j / k) if i < old - 1 else table[old - 1])
    return torch.stack(out)


@pytest.mark.parametrize("old,rows", [(5, 20), (5, 23), (8, 16), (3, 31)])
def test_stride_places_old_rows_every_kth_position(old, rows):
    table = torch.randn(old, 6)
    new = resample_table(table, rows, "stride")
    k = rows // old
    assert new.shape == (rows, 6)
    assert torch.equal(new[: k * old : k], table)  # old row i exactly at k * i
    torch.testing.assert_close(new, stride_by_hand(table, rows), atol=1e-6, rtol=0)


def test_stride_same_length_and_shrinking():
    table = torch.randn(8, 4)
    assert torch.equal(resample_table(table, 8, "stride"), table)
    assert torch.equal(resample_table(table, 5, "stride"), table[:5])
    widened = resample_table(table, 12, "stride")  # k = 1: rows stay, the new ones repeat the last
    assert torch.equal(widened[:8], table) and torch.equal(widened[8:], table[-1:].expand(4, -1))


def test_stride_keeps_robertas_padding_rows():
    model = make_model("roberta", "RobertaModel")
    weight = model.embeddings.position_embeddings.weight.detach().clone()  # 2 padding rows, then 32 positions
    posswap.patch(model, posswap.InterpolateConfig(max_length=128, mode="stride"))
    new = model.embeddings.position_embeddings.weight.detach()
    assert new.shape[0] == 2 + 128
    assert torch.equal(new[:2], weight[:2])
    assert torch.equal(new[2::4], weight[2:])  # position k*i (row 2 + k*i) holds old position i
    torch.testing.assert_close(new, resample_positions(weight, 2, 128, "stride"), atol=0, rtol=0)
    torch.testing.assert_close(new[2:], stride_by_hand(weight[2:], 128), atol=1e-6, rtol=0)


def test_stride_model_runs_and_round_trips(tmp_path):
    model = posswap.patch(make_model("bert", "BertModel"), posswap.InterpolateConfig(max_length=128, mode="stride"))
    assert torch.isfinite(outputs(model, token_ids(128))).all()
    loaded = reload_and_compare(model, tmp_path, 128)
    assert loaded.config.posswap["mode"] == "stride"


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "emma.txt"
    path.write_text(read_document("emma")[:60_000])
    return path


def test_pairs_come_from_one_document(text_file, minilm_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    pairs = document_pairs(str(text_file), tokenizer, [64, 128], pairs=12, anchor_words=8, seed=3)
    source = " ".join(text_file.read_text().split())
    for i, row in enumerate(pairs):
        assert row["positive"] in source  # a stretch of the text, whitespace aside
        assert row["anchor"] in row["positive"] and len(row["anchor"].split()) == 8  # the passage is inside it
        tokens = len(tokenizer(row["positive"])["input_ids"])
        assert [64, 128][i % 2] - 3 <= tokens <= [64, 128][i % 2]  # read whole at its length ([CLS], [SEP] in)
    again = document_pairs(str(text_file), tokenizer, [64, 128], pairs=12, anchor_words=8, seed=3)
    assert again.to_dict() == pairs.to_dict()  # seeded
    other = document_pairs(str(text_file), tokenizer, [64, 128], pairs=12, anchor_words=8, seed=4)
    assert other["positive"] != pairs["positive"]


def test_sources_are_tokenised_once_per_tokenizer(text_file, minilm_path, tmp_path):
    """The pairs and the teacher's texts of each run of a soup read one tokenisation; another tokenizer (or the
    same one with other settings) gets its own, equal to tokenising by hand."""
    first = transformers.AutoTokenizer.from_pretrained(minilm_path)
    texts, offsets = tokenized_sources(str(text_file), first, "text")
    again = tokenized_sources(str(text_file), transformers.AutoTokenizer.from_pretrained(minilm_path), "text")
    assert again[1] is offsets  # a second load of the same tokenizer: kept
    edited = tmp_path / "edited.txt"
    edited.write_text(text_file.read_text())
    before = tokenized_sources(str(edited), first, "text")[1]
    edited.write_text("A new text entirely, " * 40)
    assert tokenized_sources(str(edited), first, "text")[1][0].tolist() != before[0].tolist()  # an edit is read
    cased = transformers.AutoTokenizer.from_pretrained(minilm_path)
    cased.backend_tokenizer.normalizer = tokenizers.normalizers.BertNormalizer(lowercase=False)
    for tokenizer in (cased, transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)):
        _, theirs = tokenized_sources(str(text_file), tokenizer, "text")
        by_hand = tokenizer(texts[0], add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        assert theirs[0].tolist() == [list(span) for span in by_hand] and theirs[0].tolist() != offsets[0].tolist()


def test_a_hard_negative_differs_from_its_document_only_in_the_passage(text_file, minilm_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    pairs = document_pairs(str(text_file), tokenizer, [64, 128], 12, 8, seed=3, hard_negatives=True)
    plain = document_pairs(str(text_file), tokenizer, [64, 128], 12, 8, seed=3)
    assert pairs[0]["positive"] == plain[0]["positive"] and pairs[0]["anchor"] == plain[0]["anchor"]
    for row in pairs:
        document, negative, anchor = row["positive"].split(" "), row["negative"].split(" "), row["anchor"]
        assert len(negative) == len(document) and anchor not in row["negative"]
        # The words that differ all lie within the anchor's 8-word place in the document.
        changed = [i for i, (a, b) in enumerate(zip(document, negative)) if a != b]
        first = next(i for i in range(len(document)) if " ".join(document[i : i + 8]) == anchor)
        assert changed and first <= changed[0] and changed[-1] < first + 8


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory, minilm_path) -> Path:
    """A sentence-transformers folder: a tiny random BERT (64 positions) with MiniLM's tokenizer, mean pooling."""
    folder = tmp_path_factory.mktemp("tiny-st")
    tiny_sentence_transformer(folder / "bert", minilm_path, positions=64).save(str(folder / "st"))
    return folder / "st"


def recipe(tiny_st: Path, text_file: Path, out: Path) -> dict:
    return {
        "model": str(tiny_st),
        "posswap": {"method": "interpolate", "max_length": 256, "mode": "stride"},
        "data": {"train": str(text_file)},
        "embedding": {"document_lengths": [64, 256], "pairs": 8, "anchor_words": 8, "mini_batch_size": 2},
        "train": {"output_dir": str(out), "max_steps": 3, "batch_size": 4, "lr": 1e-3, "log_every": 1},
    }


@pytest.mark.parametrize("hard_negatives", [False, True])
def test_embedding_recipe_runs_end_to_end(tiny_st, text_file, tmp_path, capsys, hard_negatives):
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"]["hard_negatives"] = hard_negatives  # (anchor, document, negative) triplets through MNRL
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    shown = capsys.readouterr()
    # One bar with the loss on it; not the trainer's printed dict per step and of run totals.
    assert "train: 100%" in shown.err and "loss=" in shown.err
    assert "{'loss'" not in shown.out + shown.err and "train_runtime" not in shown.out + shown.err
    folder = tmp_path / "run" / "model"
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log] == [1, 2, 3]
    trained = posswap.from_pretrained(str(folder), device="cpu")
    assert isinstance(trained, st.SentenceTransformer) and trained.max_seq_length == 256
    assert trained[0].auto_model.config.posswap["mode"] == "stride"
    plain = st.SentenceTransformer(str(folder), device="cpu")  # interpolate: a stock folder of a new size
    texts = ["word " * 200, "A short one."]
    torch.testing.assert_close(trained.encode(texts), plain.encode(texts), atol=1e-5, rtol=0)
    # It trained: the position table moved from where the patch put it.
    untrained = posswap.patch(
        st.SentenceTransformer(str(tiny_st), device="cpu"), posswap.InterpolateConfig(256, "stride")
    )
    table = lambda m: m[0].auto_model.embeddings.position_embeddings.weight  # noqa: E731
    assert not torch.equal(table(trained), table(untrained))


def test_gradient_checkpointing_trains_the_same_weights_without_a_warning(tiny_st, text_file, tmp_path, monkeypatch):
    """train.gradient_checkpointing on an embedding recipe: enabled on the transformer itself (the Trainer's route
    warns three times under transformers 5.24), and the same weights as the run without it."""
    from posswap.embeddings.training import trainer as embedding

    enabled = []
    original = embedding.enable_checkpointing
    monkeypatch.setattr(embedding, "enable_checkpointing", lambda model: (enabled.append(model), original(model)))
    runs = {}
    for checkpointing in (False, True):
        spec = recipe(tiny_st, text_file, tmp_path / f"run-{checkpointing}")
        spec["train"]["gradient_checkpointing"] = checkpointing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            posswap.train(recipe_from_dict(spec))
        assert not [w for w in caught if "checkpointing" in str(w.message)]
        runs[checkpointing] = st.SentenceTransformer(str(tmp_path / f"run-{checkpointing}" / "model"), device="cpu")
    assert len(enabled) == 1 and enabled[0].is_gradient_checkpointing
    plain, checkpointed = (dict(runs[c][0].auto_model.named_parameters()) for c in (False, True))
    for name, weight in plain.items():
        torch.testing.assert_close(checkpointed[name], weight, rtol=1e-4, atol=1e-6)


def test_a_run_from_python_without_the_raw_recipe_writes_its_files_and_a_fresh_log(tiny_st, text_file, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log.jsonl").write_text('{"step": 99, "loss": 0.0}\n')  # an earlier run's log: replaced, not appended to
    posswap.train(recipe_from_dict(recipe(tiny_st, text_file, run)))
    assert {"recipe.yaml", "recipe.json", "log.jsonl", "model"} <= {p.name for p in run.iterdir()}
    assert [json.loads(line)["step"] for line in (run / "log.jsonl").read_text().splitlines()] == [1, 2, 3]


def test_a_soup_is_the_average_of_the_runs_its_seeds_train(tiny_st, text_file, tmp_path):
    """embedding.soup: 2 with train.seed 5 saves the mean of the weights that one-run recipes with seeds 5 and 6
    train; its log has both runs' steps, each with its seed."""

    def run(name: str, seed: int, soup: int = 1) -> dict[str, torch.Tensor]:
        raw = recipe(tiny_st, text_file, tmp_path / name)
        raw["train"]["seed"] = seed
        raw["embedding"]["soup"] = soup
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(raw))
        assert main(["train", str(tmp_path / f"{name}.yaml")]) == 0
        return st.SentenceTransformer(str(tmp_path / name / "model"), device="cpu").state_dict()

    soup, first, second = run("soup", 5, soup=2), run("five", 5), run("six", 6)
    moved = [k for k in first if not torch.equal(first[k], second[k])]
    assert moved  # the two seeds trained apart: their mean is neither
    for key in first:
        torch.testing.assert_close(soup[key].double(), (first[key].double() + second[key].double()) / 2)
    log = [json.loads(line) for line in (tmp_path / "soup" / "log.jsonl").read_text().splitlines()]
    assert [(line["seed"], line["step"]) for line in log] == [(5, 1), (5, 2), (5, 3), (6, 1), (6, 2), (6, 3)]


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda r: r["embedding"].update(soup=0), "embedding.soup must be a positive integer"),
        (lambda r: r["embedding"].update(pairz=3), r"Unknown key\(s\) in embedding: pairz"),
        (lambda r: r["embedding"].update(loss="triplet"), "embedding.loss must be one of"),
        (lambda r: r["embedding"].update(hard_negatives="yes"), "embedding.hard_negatives must be true or false"),
        (lambda r: r["embedding"].update(document_lengths=[512]), "longer than posswap.max_length"),
        (lambda r: r["train"].update(curriculum=[64, 128]), "train.curriculum is not used by an embedding recipe"),
        (lambda r: r["train"].update(trainable="lora"), "train.trainable .embedding recipe. must be one of"),
        (lambda r: r.update(eval={"lengths": [64]}), "eval.lengths"),
        (lambda r: r["embedding"].update(pairs=3), r"embedding.pairs \(3\) is fewer than one optimizer step"),
        (lambda r: r["embedding"].update(anchor_words="abc"), "embedding.anchor_words must be a positive integer"),
        # No posswap block: the model reads its own 64 tokens, and a 256-token document would be cut.
        (lambda r: r.update(posswap=None), "document_lengths entry 256 is longer than the model reads .64 tokens."),
        (lambda r: r["embedding"].update(chunk_teacher=-1), "embedding.chunk_teacher must be a whole number"),
        (lambda r: r["embedding"].update(chunk_teacher=True), "embedding.chunk_teacher must be a whole number"),
        (
            lambda r: r.update(posswap=None) or r["embedding"].update(chunk_teacher=4, document_lengths=[64]),
            "embedding.chunk_teacher needs a posswap: block",
        ),
    ],
)
def test_bad_embedding_recipe_is_one_line_and_writes_nothing(tiny_st, text_file, tmp_path, capsys, change, message):
    raw = recipe(tiny_st, text_file, tmp_path / "run")
    change(raw)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 2
    *before, err = capsys.readouterr().err.strip().splitlines()
    # one line; a check that needs the model loaded comes after transformers' "Loading weights" bar
    assert re.search(message, err) and all(line.startswith("Loading weights") for line in before), (before, err)
    assert not (tmp_path / "run").exists()


def results_file(folder: Path, models: dict, fingerprints: dict) -> None:
    folder.mkdir(parents=True)
    data = {"task": "passkey", "lengths": [256, 2048], "documents": 100, "seed": 0, "depth_buckets": 5}
    data |= {"settings": {"fingerprints": fingerprints}, "models": models}
    (folder / "retrieval.json").write_text(json.dumps(data))


def scored(limit: int, accuracy: list[float]) -> dict:
    stderr = [(p * (1 - p) / 100) ** 0.5 for p in accuracy]
    return {"limit": limit, "accuracy": accuracy, "stderr": stderr, "by_depth": [], "hits": []}


def readme_tool():
    """The report that writes the README's and docs' long-embedding tables (posswap.embeddings.report_tables)."""
    from posswap.embeddings import report_tables

    return report_tables


def test_readme_table_comes_from_the_json(tmp_path, capsys):
    tool = readme_tool()
    prints = {"256": "a", "2048": "b"}
    results_file(tmp_path / "untrained" / "passkey", {"minilm-512": scored(512, [0.9, 0.2])}, prints)
    results_file(tmp_path / "trained", {"trained": scored(2048, [0.85, 0.81])}, prints)
    assert tool.main(["--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # a row per model, a column per length
    assert "| minilm-512 | 0.90 ± 0.03 | 0.20 ± 0.04 |" in out and "| trained | 0.85 ± 0.04 | 0.81 ± 0.04 |" in out
    assert "target 0.8: reached" in out
    assert "At 256 tokens, trained: -0.05 against minilm-512 (a fall beyond; minilm-512's standard error 0.03)." in out
    results_file(tmp_path / "other" / "trained", {"trained": scored(2048, [0.9, 0.8])}, {"256": "x", "2048": "b"})
    (tmp_path / "other" / "untrained" / "passkey").mkdir(parents=True)
    copied = (tmp_path / "untrained" / "passkey" / "retrieval.json").read_text()
    (tmp_path / "other" / "untrained" / "passkey" / "retrieval.json").write_text(copied)
    with pytest.raises(SystemExit, match="different documents"):
        tool.main(["--results", str(tmp_path / "other")])


def test_readme_table_joins_a_recipes_seeds_in_one_column(tmp_path, capsys):
    """trained-seed1/ (model <name>-seed1) joins trained/ (<name>): mean ± standard deviation over the seeds, and the
    lowest seed's cost at short lengths."""
    tool = readme_tool()
    prints = {"256": "a", "2048": "b"}
    results_file(tmp_path / "untrained" / "passkey", {"minilm-512": scored(512, [0.9, 0.2])}, prints)
    results_file(tmp_path / "trained", {"run": scored(2048, [0.9, 0.7])}, prints)
    results_file(tmp_path / "trained-seed1", {"run-seed1": scored(2048, [0.8, 0.5])}, prints)
    results_file(tmp_path / "trained-seed2", {"run-seed2": scored(2048, [1.0, 0.6])}, prints)
    assert tool.main(["--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # mean 0.90 / 0.60; sample standard deviation sqrt(((0)^2 + 0.1^2 + 0.1^2) / 2) = 0.10 at both lengths
    assert "| model \\ tokens | 256 | 2048 |" in out
    assert (
        "| minilm-512 | 0.90 ± 0.03 | 0.20 ± 0.04 |" in out and "| run (3 seeds) | 0.90 ± 0.10 | 0.60 ± 0.10 |" in out
    )
    assert "its lowest seed -0.10 (a fall beyond)" in out and "run-seed1" not in out
    # runs named -seed0, -seed1 (no plain name) join too; two files naming the same model are refused
    results_file(tmp_path / "b" / "untrained" / "passkey", {"minilm-512": scored(512, [0.9, 0.2])}, prints)
    results_file(tmp_path / "b" / "trained", {"x-seed0": scored(2048, [0.9, 0.7])}, prints)
    results_file(tmp_path / "b" / "trained-seed1", {"x-seed1": scored(2048, [0.7, 0.5])}, prints)
    assert tool.main(["--results", str(tmp_path / "b")]) == 0
    assert "| x (2 seeds) | 0.80 ± 0.14 | 0.60 ± 0.14 |" in capsys.readouterr().out
    results_file(tmp_path / "b" / "trained-seed2", {"x-seed1": scored(2048, [0.5, 0.5])}, prints)
    with pytest.raises(SystemExit, match="both name a model 'x-seed1'"):
        tool.main(["--results", str(tmp_path / "b")])


def test_embedding_recipe_pushes_and_keeps_the_models_own_dropout(tiny_st, text_file, tmp_path, hub):
    """push_to_hub is honoured (it was read and ignored); embedding.dropout changes training only, not the
    dropout the saved config gives whoever loads it."""
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"]["dropout"] = 0.0
    spec["push_to_hub"] = "me/tiny-st-256"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    folder = tmp_path / "run" / "model"
    files = hub.files("me/tiny-st-256")
    assert "modules.json" in files and files["modules.json"] == (folder / "modules.json").read_bytes()
    config = json.loads((folder / "config.json").read_text())
    assert config["attention_probs_dropout_prob"] == 0.1 and config["hidden_dropout_prob"] == 0.1
    assert not (tmp_path / "run" / "trainer").exists()  # the trainer's empty folder is not left behind


def test_the_chunking_verdict_prefers_fewer_vectors_within_one_standard_error(tmp_path):
    tool = readme_tool()
    prints = {"256": "a", "2048": "b"}
    stock = scored(256, [0.77, 0.09])
    baselines = {"minilm": stock, "minilm chunk-mean@256": scored(256, [0.77, 0.2])}
    baselines["minilm chunk-max@256"] = scored(256, [0.79, 0.77])
    long = {"minilm": stock, "long": scored(2048, [0.78, 0.60]), "long late-chunk-max@256": scored(2048, [0.9, 0.5])}
    results_file(tmp_path / "baselines" / "passkey", baselines, prints)
    results_file(tmp_path / "late-chunks" / "passkey", long, prints)
    lines = tool.chunking_block(tmp_path, "passkey")
    assert lines[0] == "| model \\ tokens | 256 | 2048 |"
    assert [line.split(" |")[0] for line in lines[2:7]] == [
        "| minilm",
        "| minilm chunk-mean@256",
        "| minilm chunk-max@256",
        "| long",
        "| long late-chunk-max@256",
    ]
    # 256: late chunks lead (0.90) by more than their standard error (0.03); 2048: the stock model's chunks.
    assert lines[-1].endswith(
        "256: late chunks 0.90 (long late-chunk-max@256); 2048: chunks 0.77 (minilm chunk-max@256)."
    )
    results_file(tmp_path / "b2" / "baselines" / "passkey", baselines, prints)
    long["long late-chunk-max@256"] = scored(2048, [0.8, 0.5])  # within 0.78's standard error: one vector
    results_file(tmp_path / "b2" / "late-chunks" / "passkey", long, prints)
    assert (
        "256: one vector 0.78 (long; best late chunks 0.80 ± 0.04)"
        in tool.chunking_block(tmp_path / "b2", "passkey")[-1]
    )


def test_the_teachers_rows_are_the_unpatched_models_embeddings(tiny_st, text_file):
    from posswap.embeddings.training.teacher import TeacherLoss, teacher_rows

    model = st.SentenceTransformer(str(tiny_st), device="cpu")
    rows = teacher_rows(model, str(text_file), 5, 8, seed=0, text_column="text")
    texts = rows["text"]
    assert len(texts) == 5 and [len(t.split()) for t in texts[0::2]] == [8, 8, 8]  # passages, then documents
    counts = [len(ids) for ids in model.tokenizer(texts[1::2])["input_ids"]]
    assert all(48 < n <= 64 for n in counts)  # documents of the model's own limit, read whole
    labels = torch.tensor(rows["label"])
    torch.testing.assert_close(labels, model.encode(texts, convert_to_tensor=True), atol=1e-6, rtol=0)
    assert teacher_rows(model, str(text_file), 0, 8, seed=0, text_column="text") is None

    # The loss: 1 - cosine with the teacher's vectors, 0 for the teacher itself.
    features = model.preprocess(texts)
    loss = TeacherLoss(model)
    other = torch.roll(labels, 1, dims=0)
    by_hand = (1 - torch.nn.functional.cosine_similarity(labels, other, dim=-1)).mean()
    with torch.no_grad():
        assert float(loss([features], labels)) == pytest.approx(0.0, abs=1e-6)
        assert float(loss([features], other)) == pytest.approx(float(by_hand), abs=1e-5)


def test_an_embedding_recipe_with_a_teacher_trains_on_both(tiny_st, text_file, tmp_path):
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"]["teacher"] = 8
    spec["train"]["max_steps"] = 4  # 2 batches of pairs, 2 of the teacher's texts
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log] == [1, 2, 3, 4]
    # The teacher's batches are 1 - cosine (at most 2), the ranking batches a cross-entropy over 4 documents.
    assert any(line["loss"] < 0.5 for line in log) and any(line["loss"] > 0.5 for line in log), log


def test_the_chunk_teachers_rows_are_the_unpatched_models_pieces(tiny_st, text_file):
    from posswap.embeddings.chunking import split_into_chunks
    from posswap.embeddings.training.chunks import LateChunkLoss, chunk_teacher_rows

    model = st.SentenceTransformer(str(tiny_st), device="cpu")  # reads 64 tokens
    rows = chunk_teacher_rows(model, str(text_file), 3, 256, seed=0, text_column="text")
    assert chunk_teacher_rows(model, str(text_file), 0, 256, seed=0, text_column="text") is None
    labels = torch.tensor(rows["label"]).view(3, -1, 32)  # tiny_st's width
    for text, label in zip(rows["text"], labels):
        pieces = split_into_chunks(model.tokenizer, text, 64)
        assert 4 <= len(pieces) <= 5 and len(model.tokenizer(text)["input_ids"]) <= 256
        torch.testing.assert_close(
            label[: len(pieces)], model.encode(pieces, convert_to_tensor=True), atol=1e-6, rtol=0
        )
        assert not label[len(pieces) :].any()  # zero rows pad a label to the longest one's count

    # The loss, by hand: the patched model's token outputs over each piece's 62 text tokens ([CLS] before the
    # first), averaged, against the pieces' vectors read alone.
    posswap.patch(model, posswap.InterpolateConfig(256, "stride"))
    loss = LateChunkLoss(model, 64)
    features = model.preprocess(rows["text"])
    by_hand = []
    with torch.no_grad():
        for text, label in zip(rows["text"], labels):
            text_tokens = model.encode([text], output_value="token_embeddings")[0][1:-1]  # no [CLS], [SEP]
            means = torch.stack([text_tokens[s : s + 62].mean(0) for s in range(0, len(text_tokens), 62)])
            count = min(len(means), int(label.abs().sum(-1).gt(0).sum()))
            by_hand.append((1 - torch.nn.functional.cosine_similarity(means[:count], label[:count], dim=-1)).mean())
        assert float(loss([features], labels.flatten(1))) == pytest.approx(float(torch.stack(by_hand).mean()), abs=1e-5)


def test_an_embedding_recipe_with_a_chunk_teacher_trains_on_both(tiny_st, text_file, tmp_path):
    path = tmp_path / "recipe.yaml"
    spec = recipe(tiny_st, text_file, tmp_path / "run")
    spec["embedding"]["chunk_teacher"] = 8
    spec["train"]["max_steps"] = 4  # 2 batches of pairs, 2 of the chunk teacher's documents
    path.write_text(yaml.safe_dump(spec))
    assert main(["train", str(path)]) == 0
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [line["step"] for line in log] == [1, 2, 3, 4]
    # The chunk teacher's batches are 1 - cosine of nearby vectors (small), the ranking batches a cross-entropy.
    assert any(line["loss"] < 0.5 for line in log) and any(line["loss"] > 0.5 for line in log), log
