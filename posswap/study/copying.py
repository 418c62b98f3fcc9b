"""The copying study: does a patched model read back past its old window? Every method is retrofitted onto the
copier (a GPT-2 of 256 learned positions that copies inside its window), trained an equal budget on tiled
windows of 4x, and probed with a span of random ids repeated d tokens later, untrained and every few steps.

A run is one (variant, seed): the seed draws the training windows and the probe's spans. Each run is written to
the work folder as it finishes, so an interrupted study resumes; runs go to ``jobs`` processes of one thread
each (a model this small does not use two threads well, two processes do).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from multiprocessing import active_children, get_context, parent_process
from pathlib import Path

import torch

from ..config import check_number
from ..portable.posswap_block import migrate_block
from .copier import CopierRecipe, copier, make_optimizer, tiled_windows, train_step
from .copying_report import write_report
from .plan import EXTEND, VARIANTS, variant_patch
from .scoring import BASELINE, damage, hold_work, set_aside, write_json

MULTIPLES = (0.5, 1.5, 3, 6)  # probed distances, in multiples of the copier's window; 6x is past the trained 4x
CHECK_MULTIPLES = (0.25, 0.5, 0.75)  # where the copier must copy before anything uses it
MIN_COPY = 4.0  # nats; perfect copying of random ids gains log 512 = 6.24
TARGET = 3  # the multiple at which "reaches 4 nats" is asked
PROBE_SEED_SALT = 100  # the probe's draws never equal a training seed's windows
COPYING_VARIANTS = (*VARIANTS, "rope-keep", "alibi-keep")


@dataclass(frozen=True)
class Schedule:
    """How a variant trains: ``lr`` for every weight, ``position_lr`` for the position parameters if given."""

    lr: float = 3e-4
    position_lr: float | None = None
    # Weight of the KL to the unpatched copier on each window's first 1x tokens (train.distill's term; 0: none).
    distill: float = 0.0


@dataclass(frozen=True)
class CopyingSpec:
    """A copying study: ``variants`` (names of ``variant_patch``) trained ``steps`` of ``batch_size`` tiled windows
    of 4x at ``schedule`` (or ``schedules[name]``), probed every ``probe_every`` steps with ``spans`` spans of
    ``span`` ids per distance, for each of ``seeds``; the original trained the same tokens at 1x if ``baseline``."""

    name: str
    variants: tuple[str, ...]
    steps: int = 150
    batch_size: int = 8
    probe_every: int = 25
    seeds: tuple[int, ...] = (0, 1, 2)
    span: int = 32
    spans: int = 10
    baseline: bool = True
    schedule: Schedule = Schedule()
    schedules: dict = field(default_factory=dict)  # variant -> Schedule: the tuned recipes (RoPE)
    untrained_rows: tuple[str, ...] = ()  # the summary also shows these variants at step 0
    copier: CopierRecipe = CopierRecipe()
    copier_min_drop: float = MIN_COPY  # the copier's check (a toy copier in a test cannot copy)
    shipped_copier: bool = (
        True  # start from the copier posswap ships; False: train it from its recipe (once per work folder)
    )

    @property
    def length(self) -> int:
        return self.copier.length

    def distances(self) -> list[int]:
        return [round(m * self.length) for m in MULTIPLES]

    def schedule_of(self, name: str) -> Schedule:
        return self.schedules.get(name, ROPE_RECIPES[name][1] if name in ROPE_RECIPES else self.schedule)


# RoPE recipes tried for rebuilding copying (the study's rope drops the table and loses the circuit): what changes
# in the patch, and how they train. "partial": a quarter of each head's dims rotated, the rest left as they were.
ROPE_RECIPES = {
    "rope-lr1e-3": ({}, Schedule(lr=1e-3)),
    "rope-keep-lr1e-3": ({"absolute": "keep"}, Schedule(lr=1e-3)),
    "rope-partial": ({"rotary_dim": 0.25}, Schedule(lr=1e-3)),
    "rope-partial-keep": ({"rotary_dim": 0.25, "absolute": "keep"}, Schedule()),
    "rope-partial-keep-plr": ({"rotary_dim": 0.25, "absolute": "keep"}, Schedule(position_lr=3e-3)),
    # The table dropped, its first-layer position-position logits rebuilt by rotated q/k biases (init="fit").
    "rope-fit": ({"init": "fit"}, Schedule(lr=1e-3)),
    # The fit on half (a quarter) of each head's dims: the fitted biases carry the first layer's positional heads,
    # the unrotated dims let the second layer match content at any distance (trained windows repeat within 0.5x... 2x).
    "rope-fit-partial": ({"init": "fit", "rotary_dim": 0.5}, Schedule(lr=1e-3)),
    "rope-fit-quarter": ({"init": "fit", "rotary_dim": 0.25}, Schedule(lr=1e-3)),
    "rope-fit-partial-distill": ({"init": "fit", "rotary_dim": 0.5}, Schedule(lr=1e-3, distill=1.0)),
    # The same with the unpatched copier as teacher on each window's first 1x (issue 32).
    "rope-distill": ({}, Schedule(lr=1e-3, distill=1.0)),
    "rope-fit-distill": ({"init": "fit"}, Schedule(lr=1e-3, distill=1.0)),
    "rope-partial-keep-distill": ({"rotary_dim": 0.25, "absolute": "keep"}, Schedule(distill=1.0)),
}


def variant_config(name: str, length: int) -> dict:
    """The patch of a copying-study variant: the text study's, RoPE and ALiBi that keep the learned table, and the
    RoPE recipes."""
    if name in ("rope-keep", "alibi-keep"):
        return {**variant_patch(name.removesuffix("-keep"), length), "absolute": "keep"}
    if name in ROPE_RECIPES:
        return {**variant_patch("rope", length), **ROPE_RECIPES[name][0]}
    if name not in VARIANTS:
        raise ValueError(
            f"Unknown study variant {name!r}; choose from {', '.join([*COPYING_VARIANTS, *ROPE_RECIPES])}."
        )
    return variant_patch(name, length)


def narrowed(
    spec: CopyingSpec,
    variants: list[str] | None = None,
    steps: int | None = None,
    lr: float | None = None,
    baseline: bool = True,
    seeds: int | None = None,
) -> CopyingSpec:
    """``spec`` with the command line's choices, checked before anything trains."""
    if variants:
        spec = replace(
            spec, variants=tuple(variants), untrained_rows=tuple(n for n in spec.untrained_rows if n in variants)
        )
    if steps is not None:
        check_number("--steps", steps, minimum=1, integer=True)
        spec = replace(spec, steps=steps, probe_every=min(spec.probe_every, steps))
    if lr is not None:
        check_number("--lr", lr, above=0)
        # every variant's rate, a RoPE recipe's own included (its position_lr stays)
        spec = replace(
            spec,
            schedule=replace(spec.schedule, lr=lr),
            schedules={n: replace(spec.schedule_of(n), lr=lr) for n in spec.variants},
        )
    if seeds is not None:
        check_number("--seeds", seeds, minimum=1, integer=True)
        spec = replace(spec, seeds=tuple(range(seeds)))
    spec = replace(spec, baseline=spec.baseline and baseline)
    check_spec(spec)
    return spec


def check_spec(spec: CopyingSpec) -> None:
    """Refuse what cannot run, before the copier trains."""
    for name in spec.variants:
        variant_config(name, spec.length)  # raises for an unknown name
    check_number("--steps", spec.steps, minimum=1, integer=True)
    check_number("probe_every", spec.probe_every, minimum=1, integer=True)
    for schedule in [spec.schedule, *spec.schedules.values()]:
        check_number("--lr", schedule.lr, above=0)


# --- the probe ------------------------------------------------------------------------------------------------


def probe_stream(spec: CopyingSpec) -> torch.Tensor:
    """Held-out random ids the probe draws spans and fillers from (a seed no training window uses)."""
    return torch.randint(0, spec.copier.vocab, (50_000,), generator=torch.Generator().manual_seed(12345))


def probe(model, spec: CopyingSpec, distances: list[int], seed: int) -> dict:
    from ..evaluation.repeat import repeat_probe

    found = repeat_probe(
        model,
        None,
        probe_stream(spec),
        span=spec.span,
        distances=distances,
        spans_per_distance=spec.spans,
        seed=PROBE_SEED_SALT + seed,
        progress=False,
    )
    return {key: found[key] for key in ("drop", "drop_se")}


def check_copier(model, spec: CopyingSpec) -> dict:
    """The copier's drop at ``CHECK_MULTIPLES``; raises unless every one is at least ``MIN_COPY`` nats."""
    distances = [round(m * spec.length) for m in CHECK_MULTIPLES]
    found = {"multiples": list(CHECK_MULTIPLES), **probe(model, spec, distances, seed=0)}
    short = [f"{d:.2f} at {m:g}x" for d, m in zip(found["drop"], CHECK_MULTIPLES) if d < spec.copier_min_drop]
    if short:
        raise ValueError(
            f"The copier does not copy: its drop on a repeated span is {', '.join(short)}, below {spec.copier_min_drop:g} nats "
            "inside its own window; nothing was trained on it. Train it longer (copier steps) and run again."
        )
    return found


# --- one run --------------------------------------------------------------------------------------------------


def run_key(spec: CopyingSpec, name: str, seed: int) -> dict:
    """Everything a run's result depends on: found again in the work folder, it is not run twice."""
    return {
        "variant": name,
        "seed": seed,
        "patch": None if name == BASELINE else variant_config(name, spec.length),
        "schedule": asdict(spec.schedule_of(name)),
        "copier": asdict(spec.copier),
        **{k: getattr(spec, k) for k in ("steps", "batch_size", "probe_every", "span", "spans")},
    }


def train_and_probe(base, spec: CopyingSpec, name: str, seed: int) -> dict:
    """Patch a copy of ``base`` as ``name`` (or keep it, the baseline), probe it, then train and probe every
    ``probe_every`` steps. The baseline trains the same tokens per step as windows of 1x."""
    from ..patching import patch

    model = copy.deepcopy(base)
    if name == BASELINE:
        window, batch = spec.length, spec.batch_size * EXTEND
    else:
        patch(model, variant_config(name, spec.length))
        window, batch = EXTEND * spec.length, spec.batch_size
    schedule = spec.schedule_of(name)
    optimizer = make_optimizer(model, schedule.lr, schedule.position_lr)
    generator = torch.Generator().manual_seed(1_000 + seed)
    distances = spec.distances()
    curve, seconds = [{"step": 0, **probe(model, spec, distances, seed)}], 0.0
    attention = {"step 0": layer0_attention(model, spec)}
    teacher = base.eval() if schedule.distill > 0 and name != BASELINE else None
    for step in range(1, spec.steps + 1):
        clock = time.perf_counter()
        model.train()
        ids = tiled_windows(batch, window, (16, window // 2), spec.copier.vocab, generator)
        train_step(model, optimizer, ids, distill=(teacher, spec.length, schedule.distill) if teacher else None)
        seconds += time.perf_counter() - clock
        if step % spec.probe_every == 0 or step == spec.steps:
            curve.append({"step": step, **probe(model, spec, distances, seed)})
    attention["trained"] = layer0_attention(model, spec)
    return {
        "key": run_key(spec, name, seed),
        "train_seconds": round(seconds, 1),
        "curve": curve,
        "layer0_attention": attention,
    }


ATTENTION_DISTANCE = 16  # offsets shown for the layer-0 heads: the previous-token head lives at 1


def layer0_attention(model, spec: CopyingSpec) -> list[list[float]]:
    """Per head of layer 0, the mean attention weight at each offset 0..``ATTENTION_DISTANCE``, over one window of
    random ids as long as the model reads (at most 4x): where the previous-token head shows, or does not."""
    from ..evaluation.stream import context_limit
    from .pictures import attention_by_distance

    length = min(EXTEND * spec.length, context_limit(model) or EXTEND * spec.length)
    ids = probe_stream(spec)[-length:]  # the stream's end: the probe's spans rarely reach it, and it is random anyway
    return attention_by_distance(model, ids, ATTENTION_DISTANCE, per_head=True)[0].tolist()


def run_file(work: Path, name: str, seed: int) -> Path:
    return work / "runs" / name / f"seed{seed}.json"


def _worker(base_folder: str, spec: CopyingSpec, name: str, seed: int, work: str) -> str:
    """One run in a worker process (one thread), written to its file; returns its name for the progress bar."""
    from .copier import load_copier

    if _WORKER["stopping"] or (_WORKER["stop"] is not None and _WORKER["stop"].is_set()):
        raise KeyboardInterrupt  # the study was interrupted: no new run
    _WORKER["busy"] = True
    try:
        torch.set_num_threads(1)
        base = load_copier(Path(base_folder), spec.copier)
        write_json(run_file(Path(work), name, seed), train_and_probe(base, spec, name, seed), indent=None)
    finally:
        _WORKER["busy"] = False
    return f"{name} seed {seed}"


# What a worker process of the study is doing, and the study's event that says it was interrupted.
_WORKER = {"busy": False, "stopping": False, "stop": None}


def _worker_started(stop) -> None:
    _WORKER["stop"] = stop
    signal.signal(signal.SIGINT, _on_interrupt)
    threading.Thread(target=_end_with_the_study, daemon=True).start()


def _end_with_the_study() -> None:
    """A worker ends when the study's process does: killed (SIGKILL), it left workers that ran on, wrote runs into a
    work folder the next study was using, and then waited forever on the pool's queue."""
    parent_process().join()
    os._exit(1)


def _on_interrupt(signum, frame) -> None:
    """Ctrl-C in a worker: its run stops (the KeyboardInterrupt goes back to the study) and it starts no other. An
    idle worker waits to be shut down: interrupted inside the pool's queue, it printed a traceback."""
    _WORKER["stopping"] = True
    if _WORKER["busy"]:
        _WORKER["busy"] = False  # once: a second Ctrl-C must not land outside the run
        raise KeyboardInterrupt


def _run_in_pool(todo: list, spec: CopyingSpec, base_folder: Path, work: Path, jobs: int, bar) -> None:
    """``todo`` on ``jobs`` worker processes. Ctrl-C (a terminal sends it to every process of the study; ``kill -INT``
    to this one only) ends the study with its one line, at once: the workers start with it ignored (one still
    importing printed a traceback), then a running run stops on it, and no worker starts another."""
    context = get_context("spawn")
    stop = context.Event()
    with _interrupts_ignored():  # the workers are started in submit, and inherit it until _worker_started
        pool = ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_started, initargs=(stop,))
        futures = [pool.submit(_worker, str(base_folder), spec, n, s, str(work)) for n, s in todo]
    with pool:
        try:
            for future in as_completed(futures):
                bar.set_postfix_str(f"{future.result()} done")
                bar.update()
        except KeyboardInterrupt:  # the finished runs are written; the running ones stop now
            stop.set()
            for future in futures:
                future.cancel()
            for process in active_children():
                os.kill(process.pid, signal.SIGINT)
            raise


@contextlib.contextmanager
def _interrupts_ignored():
    """SIGINT ignored inside (in the main thread; elsewhere it cannot be changed, and is left as it is)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def cached_run(work: Path, spec: CopyingSpec, name: str, seed: int) -> dict | None:
    path = run_file(work, name, seed)
    if not path.is_file():
        return None
    try:
        found = json.loads(path.read_text())
        key = found.get("key")
    except (ValueError, AttributeError) as error:  # cut short or overwritten on disk: the run is done again
        set_aside(path, damage(error))
        return None
    if isinstance(key, dict) and isinstance(key.get("patch"), dict):  # a run of an older posswap: keys renamed since
        key = {**key, "patch": migrate_block(key["patch"])}
    return found if key == json.loads(json.dumps(run_key(spec, name, seed))) else None


def run_names(spec: CopyingSpec) -> list[str]:
    return [*spec.variants, *([BASELINE] if spec.baseline else [])]


def run_all(spec: CopyingSpec, base_folder: Path, work: Path, jobs: int, progress: bool = True) -> dict:
    """Every (variant, seed) not already in ``work``, on ``jobs`` processes; returns {name: [run per seed]}."""
    from tqdm.auto import tqdm

    todo = [(n, s) for s in spec.seeds for n in run_names(spec) if cached_run(work, spec, n, s) is None]
    with tqdm(total=len(todo), desc=f"copying study: {len(todo)} runs", disable=not progress or not todo) as bar:
        if jobs <= 1:
            for name, seed in todo:
                bar.set_postfix_str(f"{name} seed {seed}")
                _worker(str(base_folder), spec, name, seed, str(work))
                bar.update()
        elif todo:
            _run_in_pool(todo, spec, base_folder, work, jobs, bar)
    return {name: [cached_run(work, spec, name, s) for s in spec.seeds] for name in run_names(spec)}


# --- the study ------------------------------------------------------------------------------------------------


def run_copying(
    spec: CopyingSpec, work: Path, out: Path, jobs: int = 2, progress: bool = True, rebuild_copier: bool = False
) -> dict:
    """The copier (found in ``work``, else the shipped one if the spec says so, else trained there;
    ``rebuild_copier``: trained in any case), checked; every run; then ``out``/copying.json and its summary and
    pictures. Returns the results dict."""
    check_spec(spec)
    with hold_work(Path(work)):  # one study per work folder: a second is refused before it reads anything there
        return _run_copying(spec, Path(work), Path(out), jobs, progress, rebuild_copier)


def _run_copying(spec: CopyingSpec, work: Path, out: Path, jobs: int, progress: bool, rebuild_copier: bool) -> dict:
    started = time.perf_counter()
    base_folder = Path(work) / "copier"
    clock = time.perf_counter()
    base, record = copier(
        base_folder,
        spec.copier,
        check=lambda model: check_copier(model, spec),
        progress=progress,
        shipped=spec.shipped_copier,
        rebuild=rebuild_copier,
    )
    base_seconds = time.perf_counter() - clock
    runs = run_all(spec, base_folder, Path(work), jobs, progress)
    untrained = {
        name: probe(_patched(base, name, spec), spec, spec.distances(), seed=spec.seeds[0])
        for name in spec.untrained_rows
    }
    results = {
        "spec": json.loads(json.dumps(asdict(spec))),
        "multiples": list(MULTIPLES),
        "distances": spec.distances(),
        "target_multiple": TARGET,
        "min_copy": MIN_COPY,
        "copier": record,
        "original": probe(base, spec, spec.distances(), seed=spec.seeds[0]),
        "original_attention": layer0_attention(base, spec),
        "untrained": untrained,
        "runs": runs,
        "timings_s": {"copier": round(base_seconds, 1), "all": round(time.perf_counter() - started, 1)},
    }
    write_json(out / "copying.json", results, indent=1)
    write_report(results, out)
    return results


def _patched(base, name: str, spec: CopyingSpec):
    from ..patching import patch

    return patch(copy.deepcopy(base), variant_config(name, spec.length))


# --- the presets ----------------------------------------------------------------------------------------------

# The full copying study: every variant, three seeds, an equal budget (100 steps of 8 x 1024 tokens).
COPYING = CopyingSpec(name="copying", variants=COPYING_VARIANTS, steps=100)
# What lets RoPE copy again: the recipes, longer (300 steps), three seeds each.
ROPE = CopyingSpec(
    name="rope",
    variants=("rope", "rope-keep", *ROPE_RECIPES),
    steps=300,
    probe_every=50,
    seeds=(0, 1, 2),
    baseline=False,
)
# The README's main command: the copier trained from its recipe (base included, as a newcomer should see it), then
# the best method and RoPE trained briefly, one seed (its timings: results/mini/copying.json).
MINI = CopyingSpec(
    name="mini",
    variants=("t5-bias-fit", "rope"),
    steps=40,
    probe_every=20,
    seeds=(0,),
    baseline=False,
    untrained_rows=("t5-bias-fit",),
    shipped_copier=False,
)
COPYING_PRESETS = {"mini": MINI, "copying": COPYING, "copying-rope": ROPE}

__all__ = [
    "BASELINE",
    "COPYING",
    "COPYING_PRESETS",
    "COPYING_VARIANTS",
    "CopyingSpec",
    "MINI",
    "MIN_COPY",
    "MULTIPLES",
    "Schedule",
    "run_copying",
    "variant_config",
]
