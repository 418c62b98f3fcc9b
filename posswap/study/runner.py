"""``posswap study``: every variant of each base at 0 steps and after the same budget, the baselines, the
crossover curves, and the files under ``results/``.

Per base: the original (the reference GPT-2, or MiniLM with an MLM head trained at 512) -> each variant
patched and scored untrained -> each variant trained for the budget, its held-out loss at 4x checked every
``eval_every`` steps -> the original trained the same steps at its own length -> everything scored again.
A run whose model folder exists with the same recipe is not trained again, so an interrupted study resumes
where it stopped.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..config import load_yaml
from ..evaluation import Results, evaluate
from ..evaluation.plots import write_plots
from ..files import remove_model_folder
from .plan import EXTEND, HELDOUT_DATA, BaseSpec, Budget, variant_patch
from .report import base_summary, curve_plot

ORIGINAL = "original"
SLIDING = "original (sliding)"
BASELINE = "original trained"


def loss_metric(causal: bool) -> str:
    return "loss" if causal else "mlm_loss"


class CurveRecorder:
    """Training callback: held-out loss at ``length`` every ``every`` steps (the crossover curve). The global
    RNG is forked around the check, so dropout and MLM masks of the run are the same with or without it."""

    def __init__(self, tokenizer, length: int, every: int, tokens: int, causal: bool, data: str = HELDOUT_DATA):
        self.tokenizer, self.length, self.every, self.tokens, self.data = tokenizer, length, every, tokens, data
        self.metric = loss_metric(causal)
        self.points: list[tuple[int, float]] = []
        self.path: Path | None = None  # set by the run: each point is written as it comes, to watch a long run

    def __call__(self, step: int, loss: float, model) -> None:
        if step % self.every:
            return
        model.eval()
        with torch.random.fork_rng(devices=[]):
            scored = evaluate({"run": model}, self.tokenizer, [self.length], self.data, max_tokens=self.tokens, progress=False)
        model.train()
        self.points.append((step, scored.models["run"].metrics[self.metric][0]))
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.points) + "\n")


class Study:
    def __init__(self, specs: tuple[BaseSpec, ...], work: Path, out: Path, reference: Path | None = None):
        self.specs, self.work, self.out = specs, Path(work), Path(out)
        self.reference = Path(reference) if reference is not None else None
        self.timings: dict[str, float] = {}

    # -- the pieces --------------------------------------------------------------------------------------

    def _timed(self, key: str, fn, *args, **kwargs):
        start = time.perf_counter()
        value = fn(*args, **kwargs)
        self.timings[key] = round(self.timings.get(key, 0.0) + time.perf_counter() - start, 1)
        return value

    def _recipe(self, spec: BaseSpec, model: str, posswap: dict | None, output_dir: Path, budget: Budget, batch_size: int, window: int | None = None) -> dict:
        train = {
            "output_dir": str(output_dir), "max_steps": budget.steps, "batch_size": batch_size, "lr": budget.lr,
            "warmup_steps": budget.warmup_steps, "weight_decay": 0.01, "trainable": "full",
            "save_every": budget.steps, "keep_checkpoints": 1, "log_every": max(1, budget.steps // 20), "seed": 0,
        }
        if window is not None and posswap is not None and window != posswap["max_length"]:
            train["curriculum"] = [window]  # patched to 8x, trained at 4x
        return {"model": model, "posswap": posswap, "data": {"train": spec.train_data}, "train": train, "eval": {"lengths": []}}

    def _train(self, raw: dict, curve: CurveRecorder | None) -> Path:
        """Train ``raw`` unless a finished run of the same recipe is there; returns its model folder."""
        from ..training import recipe_from_dict, train

        run_dir = Path(raw["train"]["output_dir"])
        done = run_dir / "model" / "config.json"
        curve_file = run_dir / "curve.json"
        if done.exists() and (run_dir / "recipe.yaml").exists() and load_yaml((run_dir / "recipe.yaml").read_text()) == raw:
            if curve is not None and curve_file.exists():
                curve.points = [tuple(p) for p in json.loads(curve_file.read_text())]
            print(f"posswap study: {run_dir} already trained with this recipe; reusing it.")
            return run_dir / "model"
        recipe = recipe_from_dict(raw)
        # An older run's model must go first: a crash of this one would otherwise leave it beside this recipe.
        remove_model_folder(run_dir / "model")  # only a model folder: never what a user put there
        if curve is not None:
            curve.path = curve_file
            curve_file.parent.mkdir(parents=True, exist_ok=True)
            curve_file.write_text("[]\n")  # not an older run's points
        return train(recipe, raw, callbacks=[curve] if curve is not None else [])

    def original(self, spec: BaseSpec) -> Path:
        """The model every variant of ``spec`` starts from."""
        if spec.name == "gpt2":
            if self.reference is not None:
                if not (self.reference / "config.json").exists():
                    raise ValueError(f"--reference {self.reference}: no model there (config.json missing).")
                return self.reference
            from .reference import RECIPE, pretrain_reference

            default = Path(load_yaml(RECIPE.read_text())["train"]["output_dir"]) / "model"
            if (default / "config.json").exists():
                return default
            print("posswap study: no reference GPT-2 yet; pretraining it first (about 55 min on 2 CPU cores).")
            return self._timed("gpt2/reference", pretrain_reference)
        if spec.name == "minilm":  # MiniLM ships without an MLM head: train one at 512, shared by every variant
            head = spec.head_budget
            raw = self._recipe(spec, "posswap:minilm", None, self.work / "minilm" / ORIGINAL, head, head.batch_size)
            return self._timed("minilm/head", self._train, raw, None)
        raise ValueError(f"Unknown base {spec.name!r}.")

    def _score(self, spec: BaseSpec, models: dict, tokenizer, beyond: str) -> Results:
        return evaluate(
            models, tokenizer, spec.lengths, spec.heldout_data, beyond=beyond, max_tokens=spec.eval_tokens,
            passkey_trials=spec.passkey_trials,
        )

    def _score_originals(self, spec: BaseSpec, original: Path, tokenizer, causal: bool) -> Results:
        """The original past its limit: read in pieces (truncate) and, causal, with a sliding window."""
        results = self._score(spec, {ORIGINAL: str(original)}, tokenizer, "truncate")
        if causal:
            results.models.update(self._score(spec, {SLIDING: str(original)}, tokenizer, "sliding").models)
        return results

    def _score_variants(self, spec: BaseSpec, originals: Results, variants: dict, tokenizer, causal: bool) -> Results:
        """``originals`` plus each variant; a causal variant read past its limit slides (its best chance), a
        masked one reads in pieces."""
        beyond = "sliding" if causal else "truncate"
        results = Results(lengths=originals.lengths, data=originals.data, settings=dict(originals.settings), models=dict(originals.models))
        for name, model in variants.items():  # one at a time: loaded, scored, released
            loaded = model() if callable(model) else model
            results.models.update(self._score(spec, {name: loaded}, tokenizer, beyond).models)
            del loaded
        results.settings["beyond"] = f"{ORIGINAL}: truncate (pieces); {'others: sliding' if causal else 'all: truncate'}"
        return results

    # -- one base ----------------------------------------------------------------------------------------

    def run_base(self, spec: BaseSpec) -> dict:
        from transformers import AutoTokenizer

        from ..training.loop import load_patched_model
        from ..training.recipe import recipe_from_dict

        original = self.original(spec)
        tokenizer = AutoTokenizer.from_pretrained(original)
        causal = spec.name == "gpt2"
        out = self.out / spec.name
        window = EXTEND * spec.length
        budget = spec.budget
        raws = {
            name: self._recipe(spec, str(original), variant_patch(name, spec.length), self.work / spec.name / name, budget, budget.batch_size, window)
            for name in spec.variants
        }

        def untrained(raw):
            return lambda: load_patched_model(recipe_from_dict(raw))[0]

        originals = self._timed(f"{spec.name}/eval original", self._score_originals, spec, original, tokenizer, causal)
        step0 = self._timed(f"{spec.name}/eval step 0", self._score_variants, spec, originals, {n: untrained(r) for n, r in raws.items()}, tokenizer, causal)
        step0.save(out / "step0" / "results.json")
        write_plots(step0, out / "step0")

        curves: dict[str, list] = {}
        trained: dict[str, Path] = {}
        for name, raw in raws.items():
            recorder = CurveRecorder(tokenizer, window, budget.eval_every, spec.eval_tokens, causal, spec.heldout_data)
            trained[name] = self._timed(f"{spec.name}/train {name}", self._train, raw, recorder)
            curves[name] = recorder.points
        if spec.baseline:  # the original, the same steps and tokens per step, at its own length
            raw = self._recipe(spec, str(original), None, self.work / spec.name / "baseline", budget, budget.batch_size * EXTEND)
            recorder = CurveRecorder(tokenizer, spec.length, budget.eval_every, spec.eval_tokens, causal, spec.heldout_data)
            trained[BASELINE] = self._timed(f"{spec.name}/train baseline", self._train, raw, recorder)
            curves[BASELINE] = recorder.points

        after = self._timed(f"{spec.name}/eval trained", self._score_variants, spec, originals, {n: str(p) for n, p in trained.items()}, tokenizer, causal)
        after.save(out / "trained" / "results.json")
        write_plots(after, out / "trained")

        metric = loss_metric(causal)
        curve_data = {
            "metric": metric, "length": window, "steps": budget.steps,
            "original_at_1x": step0.models[ORIGINAL].metrics[metric][0],
            "step0_at_4x": {n: step0.models[n].metrics[metric][spec.lengths.index(window)] for n in raws if window in spec.lengths},
            "curves": curves,
        }
        (out / "curves.json").write_text(json.dumps(curve_data, indent=2) + "\n")
        return self.report_base(spec)

    def report_base(self, spec: BaseSpec) -> dict:
        """The summary table and crossover plot of ``spec``, from the files its run saved under ``out``."""
        out = self.out / spec.name
        if not (out / "curves.json").exists():
            raise ValueError(f"No finished study of {spec.name} in {out}: run posswap study without --report-only first.")
        step0 = Results.load(out / "step0" / "results.json")
        after = Results.load(out / "trained" / "results.json")
        curve_data = json.loads((out / "curves.json").read_text())
        curve_plot(curve_data, out / "crossover.png")
        summary = base_summary(spec, step0, after, curve_data, causal=spec.name == "gpt2")
        (out / "summary.md").write_text(summary + "\n")
        return {"spec": asdict(spec), "summary": summary}

    def run(self, command: str, report_only: bool = False) -> str:
        if report_only:
            return "\n\n".join(self.report_base(spec)["summary"] for spec in self.specs)
        started = time.perf_counter()
        summaries = [self.run_base(spec) for spec in self.specs]
        wall = time.perf_counter() - started
        record = {
            "command": command,
            "wall_minutes": round(wall / 60, 1),
            "timings_s": self.timings,
            "hardware": hardware(),
            "bases": [s["spec"] for s in summaries],
        }
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "study.json").write_text(json.dumps(record, indent=2) + "\n")
        text = "\n\n".join(s["summary"] for s in summaries)
        return f"{text}\n\nWall time {wall / 60:.1f} min on {record['hardware']['description']}; files in {self.out}/."


def hardware() -> dict:
    import transformers

    description = f"{torch.get_num_threads()} CPU threads ({platform.processor() or platform.machine()})"
    if torch.cuda.is_available():
        description = torch.cuda.get_device_name(0)
    return {
        "description": description, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
    }
