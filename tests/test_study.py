"""posswap study: the plan is checked before anything trains, a tiny study writes every file it promises with
the numbers the evaluation gives, and a finished run is reused, not trained again."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace

import pytest
import yaml

from posswap.cli import main
from posswap.config import config_from_dict
from posswap.evaluation import ModelResults, Results
from posswap.study import Study, select
from posswap.study.docs_report import phase_section
from posswap.study.plan import FULL, PRESETS, VARIANTS, BaseSpec, Budget, Probe, variant_patch
from posswap.study.report import base_summary, cross_length_gap, crossover_step, probe_check
from posswap.study.scoring import set_name


def test_variants_reach_4x_and_methods_without_a_table_are_patched_to_8x():
    tables = {"interpolate", "tupe"}  # a learned table, made for 4x
    for name in VARIANTS:
        patch = variant_patch(name, 256)
        config_from_dict(patch)  # every variant is a valid posswap config
        assert patch["max_length"] == (1024 if patch["method"] in tables else 2048), name
    assert set(VARIANTS) >= {"sinusoidal", "nope", "t5-bias", "t5-bias-fit", "tupe"}
    assert variant_patch("t5-bias-fit", 256)["init"] == "fit"
    assert variant_patch("rope-yarn", 256)["factor"] == 4.0  # frequencies made for 4x, the guard allows 8x
    with pytest.raises(ValueError, match="Unknown study variant 'rope-ntk'"):
        variant_patch("rope-ntk", 256)


def test_phases_differ_in_budget_and_probe():
    quick, long = select("full", ["gpt2"])[0], select("full", ["gpt2"], phase="long")[0]
    assert (quick.phase, long.phase) == ("quick", "long")
    assert (quick.budget.steps, quick.budget.lr) == (150, 3e-4) and (long.budget.steps, long.budget.lr) == (800, 5e-5)
    assert quick.probe.distances(256) == [64, 128, 192, 384, 768, 1280, 1792]  # 0.25x to 7x
    assert len(select("full", ["minilm"], phase="long")[0].probe.multiples) > len(
        select("full", ["minilm"])[0].probe.multiples
    )
    with pytest.raises(ValueError, match="--phase"):
        select("minilm-mini", phase="long")
    with pytest.raises(ValueError, match="--phase"):
        select("full", phase="longer")


def test_select_narrows_and_refuses_bad_requests():
    specs = select("full", ["gpt2"], ["copy", "alibi"], 7)
    assert [s.name for s in specs] == ["gpt2"]
    assert specs[0].variants == ("copy", "alibi") and specs[0].budget.steps == 7
    assert specs[0].budget.eval_every <= 7
    assert [s.name for s in select("full")] == [s.name for s in FULL]
    with pytest.raises(ValueError, match="preset"):
        select("huge")
    with pytest.raises(ValueError, match="Unknown base"):
        select("minilm-mini", ["gpt2"])
    with pytest.raises(ValueError, match="--steps"):
        select("full", steps=0)


def test_cli_refuses_a_bad_plan_before_training(tmp_path, capsys):
    assert main(["study", "--variants", "copy", "rope-ntk", "--work", str(tmp_path / "w")]) == 2
    assert "rope-ntk" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def _results(values: dict[str, list[float]], lengths=(32, 64, 128, 256)) -> Results:
    models = {
        name: ModelResults(kind="causal", limit=32, metrics={"ppl": v, "loss": v, "loss_se": [0.01] * len(v)})
        for name, v in values.items()
    }
    return Results(lengths=list(lengths), data="x", models=models)


def test_summary_shows_step0_trained_errors_and_the_crossover_step():
    spec = BaseSpec(
        name="gpt2",
        length=32,
        eval_tokens=256,
        heldout=("x",),
        budget=Budget(steps=4, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=2),
    )
    step0 = _results({"original": [5.0, 7.0], "copy": [5.0, 7.0]}, lengths=(32, 128))
    after = _results({"original": [5.0] * 4, "copy": [4.5, 4.6, 4.7, 5.5], "original trained": [4.9] * 4})
    curves = {
        "metric": "loss",
        "length": 128,
        "steps": 4,
        "original_at_1x": 5.0,
        "curves": {"copy": [(2, 5.2), (4, 4.7)], "original trained": [(2, 4.95), (4, 4.9)]},
    }
    text = base_summary(spec, {"x": step0}, {"x": after}, curves, None, causal=True)
    # step 0 at 1x and 4x, then after training at every length; ppl ± ppl x se(loss)
    assert "| copy | 5.00 ± 0.05 | 7.00 ± 0.07 | 4.50 ± 0.04 | 4.60 ± 0.05 | 4.70 ± 0.05 | 5.50 ± 0.06 |" in text
    assert "| original | (same) | (same) | 5.00 ± 0.05 |" in text
    assert "| copy | 4 | 4 |" in text  # below the original at step 4; below the trained one at 4
    assert "| variant | step 0 | step 2 | step 4 |" in text and "| copy | 7.000 | 5.2000 | 4.7000 |" in text
    assert crossover_step([(2, 5.2), (4, 4.7)], 5.0) == 4
    assert crossover_step([(2, 5.2)], 5.0) is None
    windows = {"copy": [4.6, 4.8], "original trained": [4.9, 5.0]}  # at 128 tokens: gaps 0.3, 0.2
    for name, w in windows.items():
        after.models[name].metrics["loss_windows"] = [None, None, w, None]
    text = base_summary(spec, {"x": step0}, {"x": after}, curves, None, causal=True)
    assert "gap to the best ± paired standard error: `copy` 4.700; `original trained` +0.250 ± 0.050." in text
    # At 4x against the trained original at 1x: its eight 1x windows tile the two 4x ones (group means 5.0, 5.1).
    after.models["original trained"].metrics["loss_windows"][0] = [5.0, 4.9, 5.1, 5.0] + [5.1] * 4
    text = base_summary(spec, {"x": step0}, {"x": after}, curves, None, causal=True)
    assert "against `original trained` at 32, loss gap ± paired standard error over the same text" in text
    assert "`copy` -0.350 ± 0.050; `original trained` -0.100 ± 0.000." in text
    with pytest.raises(ValueError, match="3 short windows do not tile 2 long ones"):
        cross_length_gap([1.0, 2.0], [1.0, 2.0, 3.0])


def test_probe_check_warns_only_when_the_original_does_not_read_back_inside_its_window():
    def probe(drop, se):  # multiples 0.25x, 0.5x inside the window, 3x outside
        return {"multiples": [0.25, 0.5, 3], "models": {"original": {"drop": drop, "drop_se": se}}}

    assert probe_check(probe([0.9, 0.4, 0.0], [0.1, 0.1, 0.1])) is None  # reads back at 0.25x: the probe works
    assert probe_check(probe([0.3, 0.02, 0.0], [0.1, 0.1, 0.1])) is None  # 3 se at 0.25x is enough
    assert "does not work" in probe_check(
        probe([0.03, 0.02, 0.0], [0.005, 0.005, 0.1])
    )  # 6 se, but 0.03 nats is no copy
    warning = probe_check(probe([0.04, -0.06, 5.0], [0.02, 0.03, 0.1]))  # 2 se exactly is not; 3x does not count
    assert (
        "does not work on this model" in warning
        and "0.04 ± 0.02 at 0.25x" in warning
        and "-0.06 ± 0.03 at 0.5x" in warning
    )
    assert (
        probe_check({"multiples": [1.5], "models": {"original": {"drop": [0.0], "drop_se": [0.1]}}}) is None
    )  # nothing inside


def test_tiny_study_writes_results_and_reuses_finished_runs(bases, tmp_path, capsys, monkeypatch):
    text = str(bases / "text.txt")
    spec = BaseSpec(
        name="gpt2",
        length=32,
        eval_tokens=256,
        variants=("copy", "t5-bias"),
        train_data=text,
        heldout=(text, text),
        multiples=(1, 4, 8),
        budget=Budget(steps=2, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=1),
        probe=Probe(span=8, multiples=(0.5, 2), spans=3),
    )
    study = Study((spec,), tmp_path / "work", tmp_path / "results", reference=bases / "gpt2")
    summary = study.run("posswap study (test)")
    out = tmp_path / "results" / "gpt2" / "quick"
    name = set_name(text)
    step0 = Results.load(out / "step0" / f"{name}.json")
    after = Results.load(out / "trained" / f"{name}.json")
    assert step0.lengths == [32, 128] and after.lengths == [32, 128, 256]
    assert set(step0.models) == {"original", "original (sliding)", "copy", "t5-bias"}
    assert set(after.models) == set(step0.models) | {"original trained"}
    # Untrained copy reads 1x exactly as the original; the originals are scored once and carried over.
    assert step0.models["copy"].metrics["loss"][0] == pytest.approx(
        step0.models["original"].metrics["loss"][0], abs=1e-5
    )
    assert after.models["original"].metrics["loss"][1] == step0.models["original"].metrics["loss"][1]
    assert after.models["copy"].limit == 128 and after.models["t5-bias"].limit == 256
    assert all(
        v is not None and v > 0 for v in after.models["copy"].metrics["loss_se"][:2]
    )  # several windows: an error
    curves = json.loads((out / "curves.json").read_text())
    assert [step for step, _ in curves["curves"]["copy"]] == [1, 2]
    probe = json.loads((out / "probe.json").read_text())
    assert set(probe["models"]) == {"original", "copy", "t5-bias", "original trained"}
    assert probe["models"]["t5-bias"]["distances"] == [16, 64] and probe["models"]["t5-bias"]["n"] == [3, 3]
    for file in (
        "summary.md",
        "crossover.png",
        "probe.png",
        "position_maps.png",
        "attention_by_distance.png",
        "t5_buckets_t5-bias.png",
        f"trained/{name}/ppl_vs_length.png",
    ):
        assert (out / file).exists(), file
    assert "| copy |" in summary and (out / "summary.md").read_text().strip() in summary
    assert "Repeat probe" in summary
    assert (
        Study((spec,), tmp_path / "elsewhere", tmp_path / "results").run("x", report_only=True)
        == summary.split("\n\nWall time")[0]
    )
    with pytest.raises(ValueError, match="No finished quick study of gpt2"):
        Study((spec,), tmp_path / "work", tmp_path / "no-results").run("x", report_only=True)
    record = json.loads((out / "study.json").read_text())
    assert record["command"] == "posswap study (test)" and "gpt2/train copy" in record["timings_s"]

    weights = tmp_path / "work" / "gpt2" / "quick" / "copy" / "model" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    capsys.readouterr()
    with monkeypatch.context() as scored_again:  # every score is in the work folder: nothing is scored twice
        scored_again.setattr("posswap.study.scoring.evaluate", lambda *a, **k: pytest.fail("scored again"))
        scored_again.setattr("posswap.evaluation.repeat.repeat_probe", lambda *a, **k: pytest.fail("probed again"))
        assert (
            Study((spec,), tmp_path / "work", tmp_path / "results", reference=bases / "gpt2")
            .run("again")
            .startswith(summary.split("\n\nWall")[0])
        )
    assert "already trained with this recipe" in capsys.readouterr().out
    assert weights.stat().st_mtime_ns == stamp
    assert json.loads((out / "curves.json").read_text())["curves"] == curves["curves"]
    rerun = json.loads((out / "study.json").read_text())  # the rerun's record keeps the first run's timings
    assert rerun["command"] == "again" and [r["command"] for r in rerun["earlier_runs"]] == ["posswap study (test)"]
    assert rerun["earlier_runs"][0]["timings_s"] == record["timings_s"]

    # The long phase trains the quick table's best variants (by loss at 4x), longer; a -distill name trains its
    # variant again with the unpatched model as teacher, when that variant is among the best.
    long = replace(
        spec,
        phase="long",
        budget=replace(spec.budget, steps=3),
        baseline=False,
        variants=(*spec.variants, "t5-bias-distill"),
    )
    summary = Study((long,), tmp_path / "work", tmp_path / "results", reference=bases / "gpt2").run("long")
    folder = tmp_path / "results" / "gpt2" / "long"
    trained_long = Results.load(folder / "trained" / f"{name}.json")
    assert set(trained_long.models) == {"original", "original (sliding)", "copy", "t5-bias", "t5-bias-distill"}
    # Its own untrained scores, not the quick phase's (which may come from another original); a -distill variant
    # is its plain one until it trains.
    step0_long = Results.load(folder / "step0" / f"{name}.json")
    assert set(step0_long.models) == {"original", "original (sliding)", "copy", "t5-bias"}
    first_cells: dict = {}  # the first table's rows: step 0 at 1x and 4x
    for line in summary.splitlines():
        if line.startswith("| t5-bias"):
            first_cells.setdefault(line.split(" | ")[0], line.split(" | ")[1:3])
    assert first_cells["| t5-bias-distill"] == first_cells["| t5-bias"] != ["", ""]
    shutil.rmtree(tmp_path / "results" / "gpt2" / "quick" / "step0")
    assert (
        Study((long,), tmp_path / "elsewhere", tmp_path / "results").run("x", report_only=True)
        == (summary.split("\n\nWall time")[0])
    )
    long_curves = json.loads((folder / "curves.json").read_text())
    assert [s for s, _ in long_curves["curves"]["copy"]] == [1, 2, 3]
    assert weights.stat().st_mtime_ns == stamp  # the quick run is left alone
    runs = tmp_path / "work" / "gpt2" / "long"
    recipes = {n: yaml.safe_load((runs / n / "recipe.yaml").read_text()) for n in ("t5-bias", "t5-bias-distill")}
    assert recipes["t5-bias-distill"]["train"]["distill"] == {"weight": 1.0}
    assert "distill" not in recipes["t5-bias"]["train"]  # a plain variant's recipe is the one older runs have
    assert recipes["t5-bias-distill"]["posswap"] == recipes["t5-bias"]["posswap"]
    assert all(long_curves["train_seconds"][n] > 0 for n in ("copy", "t5-bias", "t5-bias-distill"))
    # the docs page gives the runs' own minutes beside the wall time (a rerun's wall time misses them)
    minutes = sum(long_curves["train_seconds"].values()) / 60
    section = "\n".join(phase_section(tmp_path / "results", "gpt2", "long"))
    assert f"The runs' own training time, summed: {minutes:.0f} min (3 runs)." in section
    # the distillation table: with minus without at 4x, paired over the same windows, by hand
    with_, without = (trained_long.models[n].metrics["loss_windows"][1] for n in ("t5-bias-distill", "t5-bias"))
    gap = sum(a - b for a, b in zip(with_, without)) / len(with_)
    row = next(line for line in summary.splitlines() if line.startswith("| `t5-bias` |"))
    assert row.split(" | ")[3].startswith(f"{gap:+.3f}") and "| `copy` |" not in summary

    # Variants named with --variants: the long phase trains every one of them, not the quick table's best of them.
    monkeypatch.setattr("posswap.study.runner.LONG_VARIANTS", 1)
    plain = replace(long, variants=("copy", "t5-bias"))
    assert len(study.best_of_quick(plain)) == 1
    assert study.best_of_quick(replace(plain, named_variants=True)) == ("copy", "t5-bias")
    assert select("full", ["gpt2"], ["copy", "t5-bias"], phase="long")[0].named_variants
    assert not select("full", ["gpt2"], phase="long")[0].named_variants


def test_long_phase_without_the_quick_one_is_refused_before_anything_trains(tmp_path, capsys):
    assert main(["study", "--phase", "long", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "r")]) == 2
    assert "run `posswap study --phase quick` first" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "config, message",
    [
        (None, "config.json missing"),
        ("{not json", "config.json is not valid JSON"),
        (
            {"model_type": "gpt2", "n_positions": 1024},
            "must be an unpatched GPT-2 with 256 positions .* holds a GPT-2 with 1024 positions",
        ),
        ({"model_type": "bert", "max_position_embeddings": 512}, "holds a bert model\\."),
        (
            {"model_type": "gpt2", "n_positions": 256, "posswap": {"method": "alibi"}},
            "with 256 positions, already patched by posswap",
        ),
    ],
)
def test_a_reference_the_study_cannot_count_from_is_refused_before_any_work(tmp_path, config, message):
    # The variants are patched to 4x of the reference's length: another length would mislabel every table.
    spec = select("full", ["gpt2"], ["copy"], 1)[0]
    reference = tmp_path / "reference"
    if config is not None:
        reference.mkdir()
        (reference / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(ValueError, match=f"--reference {re.escape(str(reference))}: .*{message}"):
        Study((spec,), tmp_path / "w", tmp_path / "r", reference=reference)
    assert not (tmp_path / "r").exists() and not (tmp_path / "w").exists()


def test_tiny_masked_study_has_the_noise_floor_and_the_masked_probe(bases, tmp_path):
    text = str(bases / "text.txt")
    spec = BaseSpec(
        name="minilm",
        length=32,
        eval_tokens=256,
        variants=("alibi",),
        baseline=False,
        train_data=text,
        heldout=(text,),
        multiples=(1, 4),
        budget=Budget(steps=1, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=1),
        probe=Probe(span=8, multiples=(0.5, 2), spans=2),
        probe_untrained=True,
    )
    study = Study((spec,), tmp_path / "work", tmp_path / "results")
    study.original = lambda spec: bases / "bert"  # the tiny BERT with an MLM head stands in for MiniLM + head
    summary = study.run("x")
    out = tmp_path / "results" / "minilm" / "quick"
    after = Results.load(out / "trained" / f"{set_name(text)}.json")
    floor = after.models["original, mask seed 1"].metrics["mlm_loss"]
    assert floor != after.models["original"].metrics["mlm_loss"]  # other masks, other numbers: the noise floor
    probe = json.loads((out / "probe.json").read_text())
    assert (
        set(probe["models"]) == {"original", "alibi (step 0)", "alibi"} and probe["models"]["alibi"]["kind"] == "masked"
    )
    assert "mask seed 1" in summary and "| alibi |" in summary


def test_repeat_fraction_reaches_the_variants_and_the_baseline_not_older_recipes(bases, tmp_path, monkeypatch):
    text = str(bases / "text.txt")
    spec = BaseSpec(
        name="gpt2",
        length=32,
        eval_tokens=64,
        variants=("alibi",),
        train_data=text,
        heldout=(text,),
        multiples=(1,),
        budget=Budget(steps=1, batch_size=1, lr=1e-3, warmup_steps=0, eval_every=1),
        step0_multiples=(1,),
        repeat_fraction=0.25,
    )
    trained = []

    def capture(self, raw, curve):
        trained.append(raw)
        raise KeyboardInterrupt  # stop before anything trains: the recipes are what this test reads

    monkeypatch.setattr(Study, "_train", capture)
    with pytest.raises(KeyboardInterrupt):
        Study((spec,), tmp_path / "w", tmp_path / "r", reference=bases / "gpt2").run("x")
    assert trained[0]["data"] == {"train": text, "repeat_fraction": 0.25}
    baseline = Study((spec,), tmp_path / "w", tmp_path / "r")._recipe(
        spec, "m", None, tmp_path / "b", spec.budget, 4, repeats=True
    )
    assert baseline["data"]["repeat_fraction"] == 0.25
    head = Study((spec,), tmp_path / "w", tmp_path / "r")._recipe(spec, "m", None, tmp_path / "h", spec.budget, 4)
    assert head["data"] == {"train": text}  # MiniLM's head (the original) trains on plain text
    plain = replace(spec, repeat_fraction=0.0)  # no flag: the recipe is what older runs saved, so they are reused
    assert Study((plain,), tmp_path / "w", tmp_path / "r")._recipe(
        plain, "m", {}, tmp_path / "v", spec.budget, 1, repeats=True
    )["data"] == {"train": text}


def test_repeat_fraction_is_checked_before_any_work(monkeypatch):
    assert {spec.repeat_fraction for spec in select("full", None, None, phase="quick", repeat_fraction=0.5)} == {0.5}
    with pytest.raises(ValueError, match="--repeat-fraction must be a number >= 0 and <= 1"):
        select("full", repeat_fraction=1.5)
    short = replace(FULL[0], length=100)
    monkeypatch.setitem(PRESETS, "full", (short,))
    with pytest.raises(
        ValueError,
        match="--repeat-fraction: a 64-token span and its copy need windows of 128 tokens; base gpt2 trains its baseline on 100",
    ):
        select("full", repeat_fraction=0.5)
    assert select("full", repeat_fraction=0.0)[0].repeat_fraction == 0.0
