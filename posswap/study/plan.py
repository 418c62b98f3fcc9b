"""What the extension study runs: the bases, the method variants, the two budgets (quick and long), the
held-out sets, the repeat probe, and the presets.

Every variant of a base trains the same number of steps on the same number of tokens per step. Methods without
a learned table (RoPE, ALiBi, sinusoidal, NoPE, T5 bias) are patched to 8x but trained on 4x windows, so that
8x is real extrapolation; the table methods (copy, linear, cubic, TUPE's extended table) are made for 4x and read
8x with a sliding window (causal) or in pieces (masked), as the original reads everything past 1x.

Phases: ``quick`` trains every variant at a small budget; ``long`` trains the best ``LONG_VARIANTS`` of the
quick table (by held-out loss at 4x on the first held-out set) and the original, longer, at a lower rate.
A variant named ``NAME-distill`` is NAME trained with the unpatched model as a teacher on the windows it can read
(``train.distill``); the long phase trains it when NAME is among the best of the quick one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import methods  # noqa: F401  (registers the methods and their variants)
from ..config import check_number
from ..registry import study_variants
from ..training.distill import DISTILLED
from ..training.recipe import DataSpec

TRAIN_DATA = "posswap:train"  # five Austen novels + the King James Bible
# Held-out sets, in no training split: the same author and era (Persuasion), then technical prose.
HELDOUT_SETS = ("posswap:austen-heldout", "posswap:technical-heldout")
HELDOUT_DATA = HELDOUT_SETS[0]
EXTEND = 4  # trained length = EXTEND x the original
MULTIPLES = (1, 2, 4, 8)  # evaluated lengths, as multiples of the original
STEP0_MULTIPLES = (1, 4)  # the untrained cost of each method, at the original length and the trained one
LONG_VARIANTS = 4  # how many of the quick table's best the long phase trains
PHASES = ("quick", "long")


# train.distill.weight of a variant named with the DISTILLED suffix (the copying study's weight).
DISTILL_WEIGHT = 1.0


def plain_variant(name: str) -> str:
    """The method variant a name trains: ``rope-distill`` is ``rope`` with the unpatched model as teacher."""
    return name.removesuffix(DISTILLED)


def variant_distill(name: str) -> float:
    """``train.distill.weight`` of a variant's runs (0: no teacher)."""
    return DISTILL_WEIGHT if name.endswith(DISTILLED) else 0.0


def variant_patch(name: str, length: int) -> dict:
    """The ``posswap:`` block of a method variant (registered with its method) for a base of ``length`` positions:
    a learned table is made for the trained 4x; the rest are patched to 8x, so that 8x is real extrapolation.
    A name with the ``-distill`` suffix patches as its plain variant (it differs in training only)."""
    table = study_variants()
    if plain_variant(name) not in table:
        raise ValueError(
            f"Unknown study variant {name!r}; choose from {', '.join(table)} (each also as NAME{DISTILLED}: "
            "trained with the unpatched model as teacher)."
        )
    spec, keys = table[plain_variant(name)]
    reach = EXTEND if spec.extends_table else 2 * EXTEND
    if keys.get("rope_type") and "factor" not in keys:  # RoPE's frequencies scaled for the trained length
        keys = {**keys, "factor": float(EXTEND)}
    return {"method": spec.name, **keys, "max_length": reach * length}


VARIANTS = tuple(study_variants())  # every registered method's variants, in registration order


@dataclass(frozen=True)
class Budget:
    """Continued pretraining of every variant: ``steps`` of ``batch_size`` windows of 4x tokens. The baseline
    (the original at its own length) takes ``EXTEND * batch_size`` windows of 1x, the same tokens per step."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    eval_every: int | None = None  # steps between held-out checks (the crossover curve)


@dataclass(frozen=True)
class Probe:
    """The repeat probe: a held-out span of ``span`` tokens, filler of d tokens, the span again, for d at each
    of ``multiples`` x the original length, ``spans`` spans per d."""

    span: int
    multiples: tuple[float, ...]
    spans: int = 20

    def distances(self, length: int) -> list[int]:
        return [int(m * length) for m in self.multiples]


@dataclass(frozen=True)
class BaseSpec:
    name: str  # "gpt2" (the reference GPT-2, causal LM) or "minilm" (real MiniLM with an MLM head, masked LM)
    length: int  # the original's positions
    budget: Budget
    eval_tokens: int  # held-out tokens scored per model, length and held-out set
    variants: tuple[str, ...] = VARIANTS
    # --variants named them: the long phase trains exactly these, not the quick phase's best of them
    named_variants: bool = False
    baseline: bool = True  # also train the original the same steps at its own length
    head_budget: Budget | None = None  # minilm: the MLM head (tied decoder) trained at 512 first, shared by all
    head_trainable: str = "full"  # what that training changes: "full" (encoder too) or "head" (encoder frozen)
    multiples: tuple[int, ...] = MULTIPLES
    train_data: str = TRAIN_DATA
    heldout: tuple[str, ...] = HELDOUT_SETS
    probe: Probe | None = None
    step0_multiples: tuple[int, ...] = STEP0_MULTIPLES
    long_budget: Budget | None = None  # the long phase
    long_probe: Probe | None = None  # the long phase's probe (more distances: fewer models to probe)
    phase: str = "quick"
    probe_untrained: bool = False  # also probe each variant right after the patch (the README's before/after)
    repeat_fraction: float = 0.0  # share of the variants' and baseline's training windows with a repeated span

    @property
    def lengths(self) -> list[int]:
        return [m * self.length for m in self.multiples]

    @property
    def step0_lengths(self) -> list[int]:
        return [m * self.length for m in self.step0_multiples if m in self.multiples]

    @property
    def heldout_data(self) -> str:
        return self.heldout[0]

    def for_phase(self, phase: str) -> BaseSpec:
        """This base in ``phase``: the long phase trains longer (its variants are picked from the quick results
        by the runner) and probes more distances."""
        if phase not in PHASES:
            raise ValueError(f"--phase must be one of {', '.join(PHASES)}; got {phase!r}.")
        if phase == "quick":
            return replace(self, phase="quick")
        if self.long_budget is None:
            raise ValueError(f"The {self.name} base of this preset has no long budget.")
        return replace(self, phase="long", budget=self.long_budget, probe=self.long_probe or self.probe)


CAUSAL_MULTIPLES = (0.25, 0.5, 0.75, 1.5, 3, 5, 7)
FULL = (
    BaseSpec(
        name="gpt2",
        length=256,
        eval_tokens=16384,
        # batch 1: on 2 CPU cores one 1024-token window trains at ~1,050 tokens/s, a batch of four at ~480 (the logits)
        budget=Budget(steps=150, batch_size=1, lr=3e-4, warmup_steps=10, eval_every=25),
        long_budget=Budget(steps=800, batch_size=1, lr=5e-5, warmup_steps=40, eval_every=100),
        probe=Probe(span=64, multiples=CAUSAL_MULTIPLES),
    ),
    BaseSpec(
        name="minilm",
        length=512,
        eval_tokens=8192,
        # MiniLM at 2048 trains at ~180 tokens/s on 2 cores (30k-word MLM logits): a small budget
        budget=Budget(steps=16, batch_size=1, lr=2e-4, warmup_steps=2, eval_every=4),
        long_budget=Budget(steps=64, batch_size=1, lr=5e-5, warmup_steps=4, eval_every=16),
        # all weights: with the encoder frozen the loss stalls near 6.4 (measured: 60 steps of 8 x 512 at lr 2e-3)
        head_budget=Budget(steps=400, batch_size=4, lr=2e-4, warmup_steps=20),
        probe=Probe(span=64, multiples=(0.25, 0.5, 1.5, 3)),
        long_probe=Probe(span=64, multiples=CAUSAL_MULTIPLES),
    ),
)

# The repeat probe on the real MiniLM past 512, before and after a short training of one method; <= 10 minutes on
# 2 CPU cores (the README's main command is the copying study's mini preset, posswap.study.copying).
MINI = (
    BaseSpec(
        name="minilm",
        length=512,
        eval_tokens=2048,
        variants=("alibi",),
        baseline=False,
        multiples=(1, 4),
        heldout=HELDOUT_SETS[:1],
        budget=Budget(steps=8, batch_size=1, lr=1e-4, warmup_steps=1, eval_every=4),
        head_budget=Budget(steps=40, batch_size=4, lr=3e-4, warmup_steps=4),
        probe=Probe(span=64, multiples=(0.25, 1.5), spans=12),
        probe_untrained=True,
    ),
)

PRESETS = {"full": FULL, "minilm-mini": MINI}


def select(
    preset: str,
    bases: list[str] | None = None,
    variants: list[str] | None = None,
    steps: int | None = None,
    lr: float | None = None,
    baseline: bool = True,
    phase: str = "quick",
    repeat_fraction: float | None = None,
) -> tuple[BaseSpec, ...]:
    """A preset in a phase, narrowed to some bases and variants, with another step count or learning rate if
    asked (checked here, before anything trains)."""
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join(PRESETS)}.")
    specs = PRESETS[preset]
    if phase != "quick" and preset != "full":
        raise ValueError(f"--phase {phase} is a phase of the full study; --preset {preset} has one phase of its own.")
    if bases:
        known = {spec.name for spec in specs}
        unknown = sorted(set(bases) - known)
        if unknown:
            raise ValueError(
                f"Unknown base(s) {', '.join(unknown)} for preset {preset!r}; choose from {', '.join(sorted(known))}."
            )
        specs = tuple(spec for spec in specs if spec.name in bases)
    specs = tuple(spec.for_phase(phase) for spec in specs)
    if variants:
        for name in variants:
            variant_patch(name, 1)  # raises for an unknown name
        specs = tuple(replace(spec, variants=tuple(variants), named_variants=True) for spec in specs)
    if steps is not None:
        if steps < 1:
            raise ValueError(f"--steps must be a positive number of optimizer steps; got {steps}.")
        specs = tuple(
            replace(spec, budget=replace(spec.budget, steps=steps, eval_every=min(spec.budget.eval_every, steps)))
            for spec in specs
        )
    if lr is not None:
        check_number("--lr", lr, above=0)
        specs = tuple(replace(spec, budget=replace(spec.budget, lr=lr)) for spec in specs)
    if not baseline:
        specs = tuple(replace(spec, baseline=False) for spec in specs)
    if repeat_fraction is not None:
        check_number("--repeat-fraction", repeat_fraction, minimum=0, maximum=1)
        span = DataSpec().repeat_span
        short = [spec for spec in specs if repeat_fraction > 0 and spec.length < 2 * span]
        if short:  # the baseline trains at the base's own length: its windows must hold a span and its copy
            raise ValueError(
                f"--repeat-fraction: a {span}-token span and its copy need windows of {2 * span} tokens; "
                f"base {short[0].name} trains its baseline on {short[0].length}. Leave the flag out for it."
            )
        specs = tuple(replace(spec, repeat_fraction=repeat_fraction) for spec in specs)
    return specs


__all__ = [
    "BaseSpec",
    "Budget",
    "EXTEND",
    "HELDOUT_SETS",
    "MULTIPLES",
    "PHASES",
    "PRESETS",
    "Probe",
    "TRAIN_DATA",
    "VARIANTS",
    "plain_variant",
    "select",
    "variant_distill",
    "variant_patch",
]
