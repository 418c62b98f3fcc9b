"""The copier and the copying study: the data has the property that makes copying learnable (the period changes
from window to window, so only content finds the earlier copy), the shipped copier is the recipe's and copies,
a base that does not copy is refused, and the study runs end to end on a toy in seconds."""

from __future__ import annotations

import json
import math

import pytest
import torch

from posswap.cli import main
from posswap.study.copier import (
    COPIER_FILE,
    SHIPPED,
    CopierRecipe,
    fingerprint,
    load_copier,
    new_copier,
    tiled_windows,
)
from posswap.study.copying import (
    BASELINE,
    CHECK_MULTIPLES,
    COPYING,
    COPYING_VARIANTS,
    MIN_COPY,
    ROPE,
    CopyingSpec,
    Schedule,
    check_copier,
    narrowed,
    run_copying,
    variant_config,
)
from posswap.study.copying_report import copying_table, distill_table, first_step, previous_token_head

TOY = CopierRecipe(vocab=64, length=32, n_layer=1, n_embd=32, n_head=2, steps=3, batch_size=4, period=(4, 16))


def smallest_period(window: torch.Tensor) -> int:
    return next(k for k in range(1, len(window) + 1) if torch.equal(window[k:], window[:-k]))


def test_tiled_windows_repeat_one_block_whose_period_changes_from_window_to_window():
    windows = tiled_windows(200, 256, (16, 128), 512, torch.Generator().manual_seed(0))
    periods = [smallest_period(w) for w in windows]
    assert all(16 <= k <= 128 for k in periods)
    # many periods, none dominant: a fixed-offset lookup from positions cannot predict the repeats
    assert len(set(periods)) > 60 and max(periods.count(k) for k in set(periods)) < 12
    assert windows.max() < 512 and windows.min() >= 0
    again = tiled_windows(200, 256, (16, 128), 512, torch.Generator().manual_seed(0))
    assert torch.equal(windows, again)  # seeded
    with pytest.raises(ValueError, match="period"):
        tiled_windows(1, 8, (5, 4), 10, torch.Generator())


def test_the_shipped_copier_is_the_recipes_and_copies_inside_its_window():
    record = json.loads((SHIPPED / COPIER_FILE).read_text())
    assert record["recipe"] == json.loads(json.dumps(CopierRecipe().__dict__))
    again = fingerprint(CopierRecipe())  # the recipe's first steps, recomputed here
    assert again["losses"] == pytest.approx(record["fingerprint"]["losses"], rel=1e-5)
    assert again["weight_abs_sum"] == pytest.approx(record["fingerprint"]["weight_abs_sum"], rel=1e-5)
    model = load_copier(SHIPPED, CopierRecipe())
    found = check_copier(model, CopyingSpec(name="t", variants=(), spans=6))
    assert min(found["drop"]) >= MIN_COPY and found["multiples"] == list(CHECK_MULTIPLES)
    assert math.log(512) > max(found["drop"])  # a drop is bounded by the loss of an unpredictable id


def test_a_base_that_does_not_copy_is_refused_before_anything_trains(tmp_path):
    spec = CopyingSpec(name="t", variants=("alibi",), copier=TOY, span=4, spans=3)
    with pytest.raises(ValueError, match=r"The copier does not copy: its drop .* below 4 nats"):
        check_copier(new_copier(TOY), spec)
    with pytest.raises(ValueError, match="does not copy"):
        run_copying(spec, tmp_path / "work", tmp_path / "out", jobs=1, progress=False)
    assert not (tmp_path / "work" / "runs").exists() and not (tmp_path / "out").exists()


def test_variants_and_command_line_choices_are_checked_first():
    assert variant_config("rope-keep", 256) == {"method": "rope", "max_length": 2048, "absolute": "keep"}
    assert variant_config("alibi-keep", 256)["absolute"] == "keep"
    assert set(COPYING.variants) == set(COPYING_VARIANTS) and COPYING.seeds == (0, 1, 2)
    with pytest.raises(ValueError, match="Unknown study variant 'rope-ntk'"):
        narrowed(COPYING, variants=["rope-ntk"])
    with pytest.raises(ValueError, match="--steps"):
        narrowed(COPYING, steps=0)
    with pytest.raises(ValueError, match="--seeds"):
        narrowed(COPYING, seeds=0)
    assert narrowed(COPYING, steps=10).probe_every == 10 and narrowed(COPYING, seeds=1).seeds == (0,)
    faster = narrowed(ROPE, lr=1e-2)  # --lr reaches every variant, a recipe with its own rate included
    assert {faster.schedule_of(n).lr for n in ROPE.variants} == {1e-2}
    assert faster.schedule_of("rope-partial-keep-plr").position_lr == 3e-3


def test_cli_refuses_text_study_flags_on_the_copier(tmp_path, capsys):
    assert main(["study", "--preset", "mini", "--model", "gpt2", "--work", str(tmp_path / "w")]) == 2
    assert "--model belongs to the text study" in capsys.readouterr().err
    assert main(["study", "--preset", "mini", "--variants", "copy", "rope-ntk", "--work", str(tmp_path / "w")]) == 2
    assert "rope-ntk" in capsys.readouterr().err
    # and the other way: the copier's flags on the text study were dropped without a word
    for flags in (["--seeds", "3"], ["--jobs", "4"], ["--build-copier"]):
        assert main(["study", "--preset", "full", *flags, "--work", str(tmp_path / "w")]) == 2
        assert f"{flags[0]} belongs to the copying study" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    assert not (tmp_path / "w").exists()


def toy_spec(**changes) -> CopyingSpec:
    """A study of the toy copier (it cannot copy: its check is off), three variants, two seeds, four steps."""
    settings = dict(
        name="toy",
        variants=("copy", "alibi", "rope"),
        steps=4,
        batch_size=2,
        probe_every=2,
        seeds=(0, 1),
        span=4,
        spans=3,
        copier=TOY,
        copier_min_drop=-100.0,
        untrained_rows=("alibi",),
        schedules={"rope": Schedule(lr=1e-3)},
    )
    return CopyingSpec(**{**settings, **changes})


def test_the_study_runs_end_to_end_on_a_toy_and_reuses_finished_runs(tmp_path):
    spec = toy_spec()
    results = run_copying(spec, tmp_path / "work", tmp_path / "out", jobs=1, progress=False)
    assert set(results["runs"]) == {"copy", "alibi", "rope", BASELINE}
    for runs in results["runs"].values():
        assert [r["key"]["seed"] for r in runs] == [0, 1]
        assert [p["step"] for p in runs[0]["curve"]] == [0, 2, 4]
        assert all(len(p["drop"]) == len(results["distances"]) for p in runs[0]["curve"])
    assert results["runs"]["rope"][0]["key"]["schedule"]["lr"] == 1e-3  # a tuned schedule reaches its runs
    assert results["distances"] == [16, 48, 96, 192]  # 0.5x, 1.5x, 3x, 6x of 32
    for name in ("copying.json", "summary.md", "probe.png", "probe_by_step.png", "attention_layer0.png"):
        assert (tmp_path / "out" / name).is_file(), name
    saved = json.loads((tmp_path / "out" / "copying.json").read_text())
    assert saved["runs"]["copy"][1]["curve"] == results["runs"]["copy"][1]["curve"]
    table = copying_table(saved)
    assert len(table) == 2 + 2 + 4  # header, rule, original, alibi at step 0, three variants and the baseline
    assert table[3].startswith("| alibi (step 0) |")

    first = (tmp_path / "work" / "runs" / "copy" / "seed0.json").stat().st_mtime_ns
    run_copying(spec, tmp_path / "work", tmp_path / "out2", jobs=1, progress=False)
    assert (tmp_path / "work" / "runs" / "copy" / "seed0.json").stat().st_mtime_ns == first
    other = run_copying(toy_spec(steps=2), tmp_path / "work", tmp_path / "out3", jobs=1, progress=False)
    assert [p["step"] for p in other["runs"]["copy"][0]["curve"]] == [0, 2]  # another budget is another run


def test_runs_in_worker_processes_equal_runs_in_this_one(tmp_path):
    spec = toy_spec(variants=("alibi",), seeds=(0,), baseline=False, untrained_rows=())
    here = run_copying(spec, tmp_path / "a", tmp_path / "oa", jobs=1, progress=False)
    there = run_copying(spec, tmp_path / "b", tmp_path / "ob", jobs=2, progress=False)
    drops = [[p["drop"] for p in r["runs"]["alibi"][0]["curve"]] for r in (here, there)]
    assert torch.allclose(torch.tensor(drops[0]), torch.tensor(drops[1]), atol=1e-5)


def test_first_step_and_previous_token_head():
    runs = [
        {"curve": [{"step": 0, "drop": [0.0, 1.0]}, {"step": 5, "drop": [0.0, 3.0]}, {"step": 10, "drop": [0.0, 5.0]}]},
        {"curve": [{"step": 0, "drop": [0.0, 1.0]}, {"step": 5, "drop": [0.0, 5.5]}, {"step": 10, "drop": [0.0, 4.0]}]},
    ]
    assert first_step(runs, 1, 4.0) == 5  # mean over seeds: 1.0, 4.25, 4.5
    assert first_step(runs, 0, 4.0) is None
    assert previous_token_head([[0.5, 0.1, 0.0], [0.1, 0.8, 0.0], [0.3, 0.3, 0.3]]) == 1


def test_the_distillation_table_pairs_each_recipe_with_its_taught_run():
    def runs(drops: list[list[float]], seconds: float) -> list[dict]:
        return [
            {"curve": [{"step": 0, "drop": [0.0] * 4}, {"step": 9, "drop": d}], "train_seconds": seconds} for d in drops
        ]

    results = {
        "multiples": [0.5, 1.5, 3.0, 6.0],
        "target_multiple": 3.0,
        "runs": {
            "rope": runs([[5.0, 0, 1.0, 0], [6.0, 0, 2.0, 0]], 100.0),
            "rope-distill": runs([[6.0, 0, 4.0, 0], [6.0, 0, 5.0, 0]], 150.0),
            "rope-fit-distill": runs([[1.0, 0, 1.0, 0]], 10.0),  # its plain recipe did not run: no row
        },
    }
    table = distill_table(results)
    rows = [line for line in table if line.startswith("| rope")]
    assert rows == ["| rope | 5.50 ± 0.71 | 6.00 ± 0.00 | 1.50 ± 0.71 | 4.50 ± 0.71 | 1.50x |"]
    assert distill_table({**results, "runs": {"rope": results["runs"]["rope"]}}) == []


def test_a_distilled_schedule_trains_against_the_unpatched_copier(tmp_path):
    """Schedule(distill=w) adds w x KL(copier || variant) on each window's first 1x: the run is keyed by it (not
    reused for the plain one) and trains otherwise; distill=0 trains exactly as the plain run."""
    plain = toy_spec(variants=("rope",), seeds=(0,), baseline=False, untrained_rows=())
    taught = toy_spec(
        variants=("rope",),
        seeds=(0,),
        baseline=False,
        untrained_rows=(),
        schedules={"rope": Schedule(1e-3, distill=1.0)},
    )
    zero = toy_spec(
        variants=("rope",),
        seeds=(0,),
        baseline=False,
        untrained_rows=(),
        schedules={"rope": Schedule(1e-3, distill=0.0)},
    )
    runs = [
        run_copying(spec, tmp_path / f"work{i}", tmp_path / f"out{i}", jobs=1, progress=False)["runs"]["rope"][0]
        for i, spec in enumerate((plain, taught, zero))
    ]  # fmt: skip  (own work folders: each run trains)
    assert runs[1]["key"]["schedule"]["distill"] == 1.0
    assert runs[1]["curve"][-1]["drop"] != runs[0]["curve"][-1]["drop"]
    assert runs[2]["curve"] == runs[0]["curve"]
