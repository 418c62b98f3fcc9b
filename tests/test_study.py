"""posswap study: the plan is checked before anything trains, a tiny study writes every file it promises with
the numbers the evaluation gives, and a finished run is reused, not trained again."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from posswap.cli import main
from posswap.config import config_from_dict
from posswap.evaluation import ModelResults, Results
from posswap.study import Study, select
from posswap.study.plan import FULL, VARIANTS, BaseSpec, Budget, variant_patch
from posswap.study.report import base_summary, crossover_step


def test_variants_reach_4x_and_rope_alibi_are_patched_to_8x():
    for name in VARIANTS:
        patch = variant_patch(name, 256)
        config_from_dict(patch)  # every variant is a valid posswap config
        assert patch["max_length"] == (2048 if patch["method"] in ("rope", "alibi") else 1024)
    for name in ("sinusoidal", "nope"):  # optional variants, patched to 8x as well
        assert config_from_dict(variant_patch(name, 256)).max_length == 2048
    assert variant_patch("rope-yarn", 256)["factor"] == 4.0  # frequencies made for 4x, the guard allows 8x
    with pytest.raises(ValueError, match="Unknown study variant 'rope-ntk'"):
        variant_patch("rope-ntk", 256)


def test_select_narrows_and_refuses_bad_requests():
    specs = select("full", ["gpt2"], ["copy", "alibi"], 7)
    assert [s.name for s in specs] == ["gpt2"]
    assert specs[0].variants == ("copy", "alibi") and specs[0].budget.steps == 7
    assert specs[0].budget.eval_every <= 7
    assert [s.name for s in select("full")] == [s.name for s in FULL]
    with pytest.raises(ValueError, match="preset"):
        select("huge")
    with pytest.raises(ValueError, match="Unknown base"):
        select("mini", ["gpt2"])
    with pytest.raises(ValueError, match="--steps"):
        select("full", steps=0)


def test_cli_refuses_a_bad_plan_before_training(tmp_path, capsys):
    assert main(["study", "--variants", "copy,rope-ntk", "--work", str(tmp_path / "w")]) == 2
    assert "rope-ntk" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _results(values: dict[str, list[float]]) -> Results:
    models = {name: ModelResults(kind="causal", limit=32, metrics={"ppl": v, "loss": v}) for name, v in values.items()}
    return Results(lengths=[32, 64, 128, 256], data="x", models=models)


def test_summary_shows_before_after_and_the_crossover_step():
    spec = BaseSpec(name="gpt2", length=32, eval_tokens=256, budget=Budget(steps=4, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=2))
    step0 = _results({"original": [5.0] * 4, "copy": [5.0, 6.0, 7.0, 8.0]})
    after = _results({"original": [5.0] * 4, "copy": [4.5, 4.6, 4.7, 5.5], "original trained": [4.9] * 4})
    after.models["original"] = step0.models["original"]
    curves = {"metric": "loss", "length": 128, "original_at_1x": 5.0, "step0_at_4x": {"copy": 7.0},
              "curves": {"copy": [(2, 5.2), (4, 4.7)], "original trained": [(2, 4.95), (4, 4.9)]}}
    text = base_summary(spec, step0, after, curves, causal=True)
    assert "| copy | 5.000 → 4.500 | 6.000 → 4.600 | 7.000 → 4.700 | 8.000 → 5.500 |" in text
    assert "| original | 5.000 | 5.000 | 5.000 | 5.000 |" in text  # the same result before and after: one value
    assert "| copy | 7.0000 | 5.2000 | 4.7000 | 4 | 4 |" in text  # below the original at step 4; below the trained one at 4
    assert crossover_step([(2, 5.2), (4, 4.7)], 5.0) == 4
    assert crossover_step([(2, 5.2)], 5.0) is None


def test_tiny_study_writes_results_and_reuses_finished_runs(bases, tmp_path, capsys):
    text = str(bases / "text.txt")
    spec = BaseSpec(
        name="gpt2", length=32, eval_tokens=256, variants=("copy", "rope"), train_data=text, heldout_data=text,
        budget=Budget(steps=2, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=1),
    )
    study = Study((spec,), tmp_path / "work", tmp_path / "results", reference=bases / "gpt2")
    summary = study.run("posswap study (test)")
    out = tmp_path / "results" / "gpt2"
    step0 = Results.load(out / "step0" / "results.json")
    after = Results.load(out / "trained" / "results.json")
    assert step0.lengths == after.lengths == [32, 64, 128, 256]
    assert set(step0.models) == {"original", "original (sliding)", "copy", "rope"}
    assert set(after.models) == set(step0.models) | {"original trained"}
    # Untrained copy reads 1x exactly as the original; the originals are scored once and carried over.
    assert step0.models["copy"].metrics["loss"][0] == pytest.approx(step0.models["original"].metrics["loss"][0], abs=1e-5)
    assert after.models["original"] == step0.models["original"]
    assert after.models["copy"].limit == 128 and after.models["rope"].limit == 256
    curves = json.loads((out / "curves.json").read_text())
    assert [step for step, _ in curves["curves"]["copy"]] == [1, 2]
    assert curves["step0_at_4x"]["rope"] == step0.models["rope"].metrics["loss"][2]
    for name in ("summary.md", "crossover.png", "step0/ppl_vs_length.png", "trained/per_position_loss.png"):
        assert (out / name).exists(), name
    assert "| copy |" in summary and (out / "summary.md").read_text().strip() in summary
    assert Study((spec,), tmp_path / "elsewhere", tmp_path / "results").run("x", report_only=True) == summary.split("\n\nWall time")[0]
    with pytest.raises(ValueError, match="No finished study of gpt2"):
        Study((spec,), tmp_path / "work", tmp_path / "no-results").run("x", report_only=True)
    record = json.loads((tmp_path / "results" / "study.json").read_text())
    assert record["command"] == "posswap study (test)" and "gpt2/train copy" in record["timings_s"]

    weights = tmp_path / "work" / "gpt2" / "copy" / "model" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    capsys.readouterr()
    Study((spec,), tmp_path / "work", tmp_path / "results", reference=bases / "gpt2").run("again")
    assert "already trained with this recipe" in capsys.readouterr().out
    assert weights.stat().st_mtime_ns == stamp
    assert json.loads((out / "curves.json").read_text())["curves"] == curves["curves"]

    # A different budget is a different recipe: trained again, not mixed up with the old run.
    longer = replace(spec, variants=("copy",), baseline=False, budget=replace(spec.budget, steps=3))
    Study((longer,), tmp_path / "work", tmp_path / "results", reference=bases / "gpt2").run("longer")
    assert weights.stat().st_mtime_ns != stamp
    assert [s for s, _ in json.loads((out / "curves.json").read_text())["curves"]["copy"]] == [1, 2, 3]


def test_missing_reference_is_a_clear_error(tmp_path):
    spec = select("full", ["gpt2"], ["copy"], 1)[0]
    with pytest.raises(ValueError, match="--reference .*config.json missing"):
        Study((spec,), tmp_path / "w", tmp_path / "r", reference=tmp_path / "nothing").run("x")
    assert not Path(tmp_path / "r").exists()
