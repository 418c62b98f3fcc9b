"""``posswap study``: one phase of the extension study per command, and the files under ``results/``.

Per base (``quick``): the original (the reference GPT-2, or MiniLM with an MLM head trained at 512) -> each
variant patched and scored untrained -> each variant trained for the budget, its held-out loss at 4x checked
every ``eval_every`` steps -> the original trained the same steps at its own length -> everything scored again on
every held-out set -> the repeat probe -> the pictures. ``long`` does the same for the best variants of the quick
table, longer. A run whose model folder exists with the same recipe is not trained again, so an interrupted
study resumes where it stopped.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import load_yaml
from ..evaluation.plots import write_plots
from ..files import remove_model_folder
from ..training.distill import DISTILLED
from .plan import EXTEND, LONG_VARIANTS, BaseSpec, Budget, plain_variant, variant_distill, variant_patch
from .report import curve_plot, probe_plot, saved_summary
from .runs import TRAIN_SECONDS, finished_run, hardware, record_run, run_seconds, same_recipe
from .scoring import (
    BASELINE,
    ORIGINAL,
    Scorer,
    hold_work,
    load_sets,
    loss_metric,
    save_sets,
    set_name,
    write_json,
)

__all__ = ["BASELINE", "ORIGINAL", "CurveRecorder", "Study", "hardware", "same_recipe"]


class CurveRecorder:
    """Training callback: held-out loss at ``length`` every ``every`` steps (the crossover curve). The global
    RNG is forked around the check, so dropout and MLM masks of the run are the same with or without it."""

    def __init__(self, tokenizer, length: int, every: int, tokens: int, causal: bool, data: str):
        self.tokenizer, self.length, self.every, self.tokens, self.data = tokenizer, length, every, tokens, data
        self.metric = loss_metric(causal)
        self.points: list[tuple[int, float]] = []
        self.path: Path | None = None  # set by the run: each point is written as it comes, to watch a long run

    def __call__(self, step: int, loss: float, model) -> None:
        from ..evaluation import evaluate

        if step % self.every:
            return
        model.eval()
        with torch.random.fork_rng(devices=[]):
            scored = evaluate(
                {"run": model},
                self.tokenizer,
                [self.length],
                self.data,
                max_tokens=self.tokens,
                progress=False,
                device=_device_of(model),
            )
        model.train()
        self.points.append((step, scored.models["run"].metrics[self.metric][0]))
        if self.path is not None:
            write_json(self.path, self.points)


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


class Untrained:
    """A variant right after the patch, built when scored; ``raw`` (its recipe) says what it is."""

    def __init__(self, raw: dict):
        self.raw = raw

    def __call__(self):
        from ..training.loop import load_patched_model
        from ..training.recipe import recipe_from_dict

        return load_patched_model(recipe_from_dict(self.raw))[0]


def check_reference(folder: Path, length: int) -> None:
    """``--reference`` must be an unpatched GPT-2 with the base's ``length`` positions: every variant's 4x and 8x,
    and the probe's multiples, count from it, so another length would give tables that are silently mislabelled."""
    path = folder / "config.json"
    if not path.exists():
        raise ValueError(f"--reference {folder}: no model there (config.json missing).")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"--reference {folder}: config.json is not valid JSON ({error}).") from None
    kind, positions, patched = config.get("model_type"), config.get("n_positions"), "posswap" in config
    if kind != "gpt2" or positions != length or patched:
        held = (
            f"a {kind} model"
            if kind != "gpt2"
            else f"a GPT-2 with {positions} positions" + (", already patched by posswap" if patched else "")
        )
        raise ValueError(
            f"--reference {folder}: the study's GPT-2 base must be an unpatched GPT-2 with {length} positions (the variants "
            f"are patched to 4x and 8x of it); this folder holds {held}. Pretrain one with python recipes/reference_gpt2.py."
        )


class Study:
    def __init__(
        self,
        specs: tuple[BaseSpec, ...],
        work: Path,
        out: Path,
        reference: Path | None = None,
        device: str | None = None,
    ):
        self.specs, self.work, self.out = specs, Path(work), Path(out)
        self.reference = Path(reference) if reference is not None else None
        for spec in specs:  # before any work: a wrong reference would otherwise show up after MiniLM's hour
            if spec.name == "gpt2" and self.reference is not None:
                check_reference(self.reference, spec.length)
        self.device = device
        self.timings: dict[str, float] = {}

    # -- the pieces --------------------------------------------------------------------------------------

    def _timed(self, key: str, fn, *args, **kwargs):
        start = time.perf_counter()
        value = fn(*args, **kwargs)
        self.timings[key] = round(self.timings.get(key, 0.0) + time.perf_counter() - start, 1)
        return value

    def _recipe(
        self,
        spec: BaseSpec,
        model: str,
        posswap: dict | None,
        output_dir: Path,
        budget: Budget,
        batch_size: int,
        window: int | None = None,
        trainable: str = "full",
        repeats: bool = False,
        distill: float = 0.0,
    ) -> dict:
        train = {
            "output_dir": str(output_dir),
            "max_steps": budget.steps,
            "batch_size": batch_size,
            "lr": budget.lr,
            "warmup_steps": budget.warmup_steps,
            "weight_decay": 0.01,
            "trainable": trainable,
            "save_every": budget.steps,
            "keep_checkpoints": 1,
            "log_every": max(1, budget.steps // 20),
            "seed": 0,
        }
        if distill:  # only when asked: older runs' recipes stay equal, so they are reused
            train["distill"] = {"weight": distill}
        if window is not None and posswap is not None and window != posswap["max_length"]:
            train["curriculum"] = [window]  # patched to 8x, trained at 4x
        data = {"train": spec.train_data}
        if repeats and spec.repeat_fraction:  # only when asked: older runs' recipes stay equal, so they are reused
            data["repeat_fraction"] = spec.repeat_fraction
        return {"model": model, "posswap": posswap, "data": data, "train": train, "eval": {"lengths": []}}

    def _train(self, raw: dict, curve: CurveRecorder | None) -> Path:
        """Train ``raw`` unless a finished run of the same recipe is there; returns its model folder."""
        from ..training import recipe_from_dict, train

        run_dir = Path(raw["train"]["output_dir"])
        curve_file = run_dir / "curve.json"
        if finished_run(run_dir, raw, curve_file if curve is not None else None):
            if curve is not None and curve_file.exists():
                curve.points = [tuple(p) for p in json.loads(curve_file.read_text())]
            print(f"posswap study: {run_dir} already trained with this recipe; reusing it.")
            return run_dir / "model"
        recipe = recipe_from_dict(raw)
        # An older run's model must go first: a crash of this one would otherwise leave it beside this recipe.
        remove_model_folder(run_dir / "model")  # only a model folder: never what a user put there
        if curve is not None:
            curve.path = curve_file
            write_json(curve_file, [])  # not an older run's points
        started = time.perf_counter()
        model = train(recipe, raw, callbacks=[curve] if curve is not None else [])
        # beside the run, so a later study that reuses it still reports what it cost
        seconds = round(time.perf_counter() - started, 1)
        write_json(
            run_dir / TRAIN_SECONDS, {"seconds": seconds, "load": os.getloadavg(), "hardware": hardware(self.device)}
        )
        return model

    def original(self, spec: BaseSpec) -> Path:
        """The model every variant of ``spec`` starts from."""
        if spec.name == "gpt2":
            if self.reference is not None:  # checked in __init__
                return self.reference
            from .reference import RECIPE, pretrain_reference

            default = Path(load_yaml(RECIPE.read_text())["train"]["output_dir"]) / "model"
            if (default / "config.json").exists():
                return default
            print("posswap study: no reference GPT-2 yet; pretraining it first (about 60 min on 2 CPU cores).")
            return self._timed("gpt2/reference", pretrain_reference)
        # MiniLM ships without an MLM head: one (tied to the word embeddings) is trained at 512.
        if spec.name == "minilm":
            head = spec.head_budget
            raw = self._recipe(
                spec,
                "posswap:minilm",
                None,
                self.work / "minilm" / ORIGINAL,
                head,
                head.batch_size,
                trainable=spec.head_trainable,
            )
            return self._timed("minilm/head", self._train, raw, None)
        raise ValueError(f"Unknown base {spec.name!r}.")

    def best_of_quick(self, spec: BaseSpec) -> tuple[str, ...]:
        """The long phase's variants: the ``LONG_VARIANTS`` lowest held-out losses at 4x after the quick budget, or
        every variant ``--variants`` named (a user who names five wants five, not the best four of them)."""
        folder = self.out / spec.name / "quick" / "trained"
        if not (folder / f"{set_name(spec.heldout_data)}.json").exists():
            raise ValueError(
                f"The long phase trains the best variants of the quick one: run `posswap study --phase quick` first (no {folder})."
            )
        if spec.named_variants:
            return spec.variants
        results = load_sets(spec, folder)[spec.heldout_data]
        metric, at = loss_metric(spec.name == "gpt2"), results.lengths.index(EXTEND * spec.length)
        asked = {plain_variant(name) for name in spec.variants}
        ranked = sorted((r.metrics[metric][at], name) for name, r in results.models.items() if name in asked)
        best = [name for _, name in ranked[:LONG_VARIANTS]]
        # each picked variant as asked: plain, with the teacher, or both
        return tuple(v for name in best for v in (name, name + DISTILLED) if v in spec.variants)

    # -- one base ----------------------------------------------------------------------------------------

    def run_base(self, spec: BaseSpec) -> dict:
        """One base: the variants' recipes -> the original scored -> each variant scored untrained (quick phase)
        -> each trained -> scored, probed and drawn -> the training curves -> the report."""
        from transformers import AutoTokenizer

        original = self.original(spec)
        tokenizer = AutoTokenizer.from_pretrained(original)
        out = self.out / spec.name / spec.phase
        raws = self._variant_recipes(spec, original)
        scorer = Scorer(spec, tokenizer, spec.name == "gpt2", self.device, cache=self.work / spec.name / "scores")

        originals = self._timed(f"{spec.name}/eval original", scorer.originals, original, spec.lengths)
        untrained = {n: Untrained(r) for n, r in raws.items()}
        # The untrained cost of each method, in each phase: the quick phase's may come from another original (the
        # reference GPT-2 trained again), and a NAME-distill variant is NAME until it trains.
        by_method: dict = {}
        for name, model in untrained.items():
            by_method.setdefault(plain_variant(name), model)
        step0 = self._timed(f"{spec.name}/eval step 0", scorer.variants, originals, by_method, spec.step0_lengths)
        save_sets(step0, out / "step0")
        trained, curves = self._train_all(spec, original, raws, tokenizer)
        self._score_trained(spec, scorer, originals, untrained, trained, original, out)
        self._timed(f"{spec.name}/pictures", self.pictures, spec, original, trained, tokenizer, out)
        self._write_curves(spec, originals[spec.heldout_data], curves, trained, out)
        return self.report_base(spec)

    def _variant_recipes(self, spec: BaseSpec, original: Path) -> dict[str, dict]:
        """Each variant's recipe (the quick phase's variants, or the best of the quick phase for the long one)."""
        variants = spec.variants if spec.phase == "quick" else self.best_of_quick(spec)
        work, budget = self.work / spec.name / spec.phase, spec.budget
        return {
            name: self._recipe(
                spec,
                str(original),
                variant_patch(name, spec.length),
                work / name,
                budget,
                budget.batch_size,
                EXTEND * spec.length,
                repeats=True,
                distill=variant_distill(name),
            )
            for name in variants
        }

    def _train_all(self, spec: BaseSpec, original: Path, raws: dict, tokenizer) -> tuple[dict[str, Path], dict]:
        """Every variant trained at 4x, and the original (the baseline) the same steps and tokens per step at its own
        length; returns their model folders and their held-out curves."""
        causal, budget = spec.name == "gpt2", spec.budget
        curves: dict[str, list] = {}
        trained: dict[str, Path] = {}
        for name, raw in raws.items():
            recorder = CurveRecorder(
                tokenizer, EXTEND * spec.length, budget.eval_every, spec.eval_tokens, causal, spec.heldout_data
            )
            trained[name] = self._timed(f"{spec.name}/train {name}", self._train, raw, recorder)
            curves[name] = recorder.points
        if spec.baseline:
            work = self.work / spec.name / spec.phase / "baseline"
            raw = self._recipe(spec, str(original), None, work, budget, budget.batch_size * EXTEND, repeats=True)
            recorder = CurveRecorder(
                tokenizer, spec.length, budget.eval_every, spec.eval_tokens, causal, spec.heldout_data
            )
            trained[BASELINE] = self._timed(f"{spec.name}/train baseline", self._train, raw, recorder)
            curves[BASELINE] = recorder.points
        return trained, curves

    def _score_trained(self, spec: BaseSpec, scorer, originals, untrained, trained, original, out: Path) -> None:
        """The trained models at every length (with plots), then the repeat probe (untrained too, if asked)."""
        after = self._timed(
            f"{spec.name}/eval trained",
            scorer.variants,
            originals,
            {n: str(p) for n, p in trained.items()},
            spec.lengths,
        )
        save_sets(after, out / "trained")
        for data, results in after.items():
            write_plots(results, out / "trained" / set_name(data))
        if spec.probe is not None:
            before = {f"{n} (step 0)": m for n, m in untrained.items()} if spec.probe_untrained else {}
            probed = self._timed(
                f"{spec.name}/probe",
                scorer.probe,
                {ORIGINAL: str(original), **before, **{n: str(p) for n, p in trained.items()}},
            )
            write_json(out / "probe.json", probed)

    def _write_curves(self, spec: BaseSpec, first, curves: dict, trained: dict[str, Path], out: Path) -> None:
        metric = loss_metric(spec.name == "gpt2")
        write_json(
            out / "curves.json",
            {
                "metric": metric,
                "length": EXTEND * spec.length,
                "steps": spec.budget.steps,
                "original_at_1x": first.models[ORIGINAL].metrics[metric][0],
                "curves": curves,
                "train_seconds": {name: run_seconds(model.parent) for name, model in trained.items()},
            },
        )

    def pictures(self, spec: BaseSpec, original: Path, trained: dict[str, Path], tokenizer, out: Path) -> None:
        """Position maps, attention against distance (after training) and the T5 buckets, on the first held-out
        set's opening window of 4x tokens."""
        from ..data.splits import load_text_dataset
        from ..evaluation.stream import resolve_device, token_stream
        from ..loading import from_pretrained
        from .pictures import (
            attention_by_distance,
            has_t5_buckets,
            plot_attention_by_distance,
            plot_position_maps,
            plot_t5_buckets,
        )

        window = EXTEND * spec.length
        ids = token_stream(load_text_dataset(spec.heldout_data)["text"], tokenizer, window)
        device = resolve_device(self.device)
        models = {ORIGINAL: original, **{n: p for n, p in trained.items() if n != BASELINE}}
        loaded = {name: from_pretrained(str(path)).eval() for name, path in models.items()}
        plot_position_maps(loaded, window, out / "position_maps.png")
        curves = {}
        for name, model in loaded.items():
            length = min(window, getattr(model.config, "max_position_embeddings", window) or window)
            curves[name] = attention_by_distance(model.to(device), ids[:length].to(device)).cpu()
            model.to("cpu")
            if has_t5_buckets(model):
                plot_t5_buckets(model, out / f"t5_buckets_{name}.png", max_distance=window)
        plot_attention_by_distance(curves, out / "attention_by_distance.png")
        write_json(out / "attention_by_distance.json", {name: c.tolist() for name, c in curves.items()})

    def report_base(self, spec: BaseSpec) -> dict:
        """The summary and plots of ``spec`` in its phase, from the files its run saved under ``out``."""
        out = self.out / spec.name / spec.phase
        if not (out / "curves.json").exists():
            raise ValueError(
                f"No finished {spec.phase} study of {spec.name} in {out}: run posswap study --phase {spec.phase} without --report-only first."
            )
        summary, curve_data, probe = saved_summary(spec, self.out)
        curve_plot(curve_data, out / "crossover.png")
        if probe is not None:
            probe_plot(probe, out / "probe.png")
        (out / "summary.md").write_text(summary + "\n")
        return {"spec": asdict(spec), "summary": summary}

    def run(self, command: str, report_only: bool = False) -> str:
        if report_only:
            return "\n\n".join(self.report_base(spec)["summary"] for spec in self.specs)
        if self.device is not None and torch.device(self.device).type == "cpu":
            os.environ["ACCELERATE_USE_CPU"] = "true"  # training too, not only scoring, stays off the GPU
        with hold_work(self.work):  # one study per work folder: a second is refused before it reads anything there
            return self._run(command)

    def _run(self, command: str) -> str:
        for spec in self.specs:
            if spec.phase == "long":
                self.best_of_quick(spec)  # the quick results must be there before anything trains
        started, summaries, machine = time.perf_counter(), [], hardware(self.device)
        for spec in self.specs:  # each base's record beside its results: phases and bases run in separate commands
            begun = time.perf_counter()
            summaries.append(self.run_base(spec))
            record_run(
                self.out / spec.name / spec.phase / "study.json",
                {
                    "command": command,
                    "phase": spec.phase,
                    "wall_minutes": round((time.perf_counter() - begun) / 60, 1),
                    "timings_s": {k: v for k, v in self.timings.items() if k.startswith(f"{spec.name}/")},
                    "hardware": machine,
                    "spec": summaries[-1]["spec"],
                },
            )
        wall = time.perf_counter() - started
        text = "\n\n".join(s["summary"] for s in summaries)
        return f"{text}\n\nWall time {wall / 60:.1f} min on {machine['description']}; files in {self.out}/."
