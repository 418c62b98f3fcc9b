"""``posswap demo``, the README's first command: the real MiniLM patched, trained with the shipped recipe cut short,
and scored against truncating and chunking. One short end-to-end run (1 step, 2 documents per length), then the
parts: the shortened recipe, the reuse of an earlier run's model, the verdict line."""

from __future__ import annotations

import json

import pytest
from test_bad_inputs import assert_one_line_error

from posswap import demo
from posswap.cli import main
from posswap.evaluation.retrieval import ModelRetrieval, RetrievalResults
from posswap.training.recipe import load_recipe

pytest.importorskip("sentence_transformers")


def test_the_demo_trains_scores_and_writes_its_table(minilm_path, tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--steps", "1", "--documents", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    results = RetrievalResults.load(out / "results")
    assert list(results.models) == [
        "stock",
        "patched",
        "trained",
        "stock chunk-mean@256",
        "stock chunk-max@256",
        "patched late-chunk-max@256",
        "trained late-chunk-max@256",
    ]
    assert results.lengths == [256, 512, 1024, 2048] and results.documents == 2
    assert results.table() in printed  # the printed table is the saved one
    assert demo.verdict(results, "trained") in printed
    run = json.loads((out / "results" / "demo.json").read_text())
    assert run["steps"] == 1 and run["train_seconds"] > 0 and run["wall_seconds"] >= run["train_seconds"]
    trained = json.loads((out / "train" / "recipe.json").read_text())
    assert trained["train"]["max_steps"] == 1 and trained["embedding"]["pairs"] == 8
    assert (out / "train" / "model" / "modules.json").is_file()


def test_a_file_where_the_results_go_is_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "results").write_text("mine")
    code = main(["demo", "--steps", "1", "--out", str(tmp_path / "demo")])
    assert_one_line_error(code, capsys.readouterr().err.strip(), "is a file, not a folder")
    assert sorted(p.name for p in (tmp_path / "demo").iterdir()) == ["results"]  # no training folder started


def test_the_shortened_recipe_is_the_shipped_one_but_for_its_length(tmp_path):
    shipped, _ = load_recipe(demo.DEMO_RECIPE)
    short, _ = demo.demo_recipe(5, tmp_path / "run")
    assert short.posswap == shipped.posswap and short.model == shipped.model
    # The chunk teacher's documents in the recipe's proportion to the pairs, whole batches, their steps on top.
    chunk_batches = round(shipped.embedding.chunk_teacher / shipped.embedding.pairs * 5)
    assert short.embedding.pairs == 5 * shipped.train.batch_size and short.train.max_steps == 5 + chunk_batches
    assert short.embedding.chunk_teacher == chunk_batches * shipped.train.batch_size
    assert short.train.lr == shipped.train.lr and short.embedding.document_lengths == shipped.embedding.document_lengths
    assert short.train.output_dir == str(tmp_path / "run")
    assert shipped.embedding.soup > 1 and short.embedding.soup == 1  # one run of the soup: the demo's minutes


def test_a_second_demo_reuses_the_model_of_the_same_recipe(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "train"
    runs = []

    def fake_train(recipe, raw, overwrite=False):  # writes what a run leaves: its recipe and a model folder
        runs.append(overwrite)
        run_dir.mkdir(exist_ok=True)
        (run_dir / "recipe.json").write_text(json.dumps(recipe.to_dict()))
        (run_dir / "model").mkdir(exist_ok=True)
        (run_dir / "model" / "modules.json").write_text("[]")
        return run_dir / "model"

    monkeypatch.setattr(demo, "train", fake_train)
    timings = {}
    assert demo.trained_model(3, run_dir, False, timings) == run_dir / "model"
    assert demo.trained_model(3, run_dir, False, timings) == run_dir / "model"
    assert "Reusing" in capsys.readouterr().out and runs == [False]  # trained once, reused once
    demo.trained_model(4, run_dir, False, timings)  # another length: trained again over the demo's own folder
    demo.trained_model(4, run_dir, True, timings)  # --overwrite: trained again
    assert runs == [False, True, True]


def test_the_verdict_names_the_longest_length_and_the_chunk_count():
    def column(accuracy, limit):
        return ModelRetrieval(limit, accuracy, [0.0] * 2, [[]] * 2, [[]] * 2)

    results = RetrievalResults("passkey", [256, 2048], 10, 0, 5)
    results.models = {
        "stock": column([0.8, 0.1], 256),
        "trained": column([0.9, 0.85], 2048),
        "stock chunk-max@256": column([0.8, 0.7], 256),
    }
    line = demo.verdict(results, "trained")
    assert line.startswith("At 2048 tokens: one trained vector finds 0.85, the stock model 0.10")
    assert "0.70 keeping 8 chunk vectors per document (stock chunk-max@256)" in line
