"""What the extension study runs: the bases, the method variants, the equal training budget, and the presets.

Every variant of a base trains the same number of steps on the same number of tokens per step. RoPE and
ALiBi (and the optional sinusoidal and NoPE variants) are patched to 8x but trained on 4x windows, so that 8x is
real extrapolation; the interpolated tables are made for 4x and read 8x with a sliding window (causal) or in
pieces (masked), as the original reads everything past 1x.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import check_number

TRAIN_DATA = "posswap:train"  # five Austen novels + the King James Bible
HELDOUT_DATA = "posswap:austen-heldout"  # Persuasion: in no training split
EXTEND = 4  # trained length = EXTEND x the original
MULTIPLES = (1, 2, 4, 8)  # evaluated lengths, as multiples of the original


def variant_patch(name: str, length: int) -> dict:
    """The ``posswap:`` block of a method variant for a base of ``length`` positions."""
    patches = {
        "copy": {"method": "interpolate", "mode": "copy", "max_length": EXTEND * length},
        "linear": {"method": "interpolate", "mode": "linear", "max_length": EXTEND * length},
        "cubic": {"method": "interpolate", "mode": "cubic", "max_length": EXTEND * length},
        "rope": {"method": "rope", "max_length": 2 * EXTEND * length},
        "rope-yarn": {"method": "rope", "max_length": 2 * EXTEND * length, "scaling": "yarn", "factor": float(EXTEND)},
        "alibi": {"method": "alibi", "max_length": 2 * EXTEND * length},
        # Not in the default study (VARIANTS); run them with --variants sinusoidal,nope. No learned table: 8x too.
        "sinusoidal": {"method": "sinusoidal", "max_length": 2 * EXTEND * length},
        "nope": {"method": "nope", "max_length": 2 * EXTEND * length},
    }
    if name not in patches:
        raise ValueError(f"Unknown study variant {name!r}; choose from {', '.join(patches)}.")
    return patches[name]


VARIANTS = ("copy", "linear", "cubic", "rope", "rope-yarn", "alibi")


@dataclass(frozen=True)
class Budget:
    """Continued pretraining of every variant: ``steps`` of ``batch_size`` windows of 4x tokens. The baseline
    (the original at its own length) takes ``EXTEND * batch_size`` windows of 1x, the same tokens per step."""

    steps: int
    batch_size: int
    lr: float
    warmup_steps: int
    eval_every: int | None = None  # steps between held-out checks (the crossover curve); the MLM head has none


@dataclass(frozen=True)
class BaseSpec:
    name: str  # "gpt2" (the reference GPT-2, causal LM) or "minilm" (real MiniLM with an MLM head, masked LM)
    length: int  # the original's positions
    budget: Budget
    eval_tokens: int  # held-out tokens scored per model and length
    passkey_trials: int = 0  # per length and depth (causal only)
    variants: tuple[str, ...] = VARIANTS
    baseline: bool = True  # also train the original the same steps at its own length
    head_budget: Budget | None = None  # minilm: the MLM head trained at 512 first, shared by every variant
    multiples: tuple[int, ...] = MULTIPLES
    train_data: str = TRAIN_DATA
    heldout_data: str = HELDOUT_DATA

    @property
    def lengths(self) -> list[int]:
        return [m * self.length for m in self.multiples]


FULL = (
    BaseSpec(
        name="gpt2", length=256, eval_tokens=16384, passkey_trials=2,
        # batch 1: on 2 CPU cores one 1024-token window trains at ~1,050 tokens/s, a batch of four at ~480 (the logits)
        budget=Budget(steps=150, batch_size=1, lr=3e-4, warmup_steps=10, eval_every=25),
    ),
    BaseSpec(
        name="minilm", length=512, eval_tokens=8192,
        # MiniLM at 2048 trains at ~180 tokens/s on 2 cores (30k-word MLM logits): a small budget
        budget=Budget(steps=16, batch_size=1, lr=2e-4, warmup_steps=2, eval_every=4),
        head_budget=Budget(steps=80, batch_size=4, lr=3e-4, warmup_steps=8),
    ),
)

# The README's main command: one method on the real MiniLM, a few steps, <= 10 minutes on 2 CPU cores.
MINI = (
    BaseSpec(
        name="minilm", length=512, eval_tokens=2048, variants=("copy",), baseline=False, multiples=(1, 2, 4),
        budget=Budget(steps=8, batch_size=1, lr=1e-4, warmup_steps=1, eval_every=4),
        head_budget=Budget(steps=30, batch_size=4, lr=3e-4, warmup_steps=3),
    ),
)

PRESETS = {"full": FULL, "mini": MINI}


def select(
    preset: str, bases: list[str] | None = None, variants: list[str] | None = None, steps: int | None = None,
    lr: float | None = None, baseline: bool = True,
) -> tuple[BaseSpec, ...]:
    """A preset, narrowed to some bases and variants, with another step count or learning rate if asked
    (checked here, before anything trains)."""
    if preset not in PRESETS:
        raise ValueError(f"Unknown preset {preset!r}; choose from {', '.join(PRESETS)}.")
    specs = PRESETS[preset]
    if bases:
        known = {spec.name for spec in specs}
        unknown = sorted(set(bases) - known)
        if unknown:
            raise ValueError(f"Unknown base(s) {', '.join(unknown)} for preset {preset!r}; choose from {', '.join(sorted(known))}.")
        specs = tuple(spec for spec in specs if spec.name in bases)
    if variants:
        for name in variants:
            variant_patch(name, 1)  # raises for an unknown name
        specs = tuple(replace(spec, variants=tuple(variants)) for spec in specs)
    if steps is not None:
        if steps < 1:
            raise ValueError(f"--steps must be a positive number of optimizer steps; got {steps}.")
        specs = tuple(replace(spec, budget=replace(spec.budget, steps=steps, eval_every=min(spec.budget.eval_every, steps))) for spec in specs)
    if lr is not None:
        check_number("--lr", lr, above=0)
        specs = tuple(replace(spec, budget=replace(spec.budget, lr=lr)) for spec in specs)
    if not baseline:
        specs = tuple(replace(spec, baseline=False) for spec in specs)
    return specs


__all__ = ["BaseSpec", "Budget", "EXTEND", "HELDOUT_DATA", "MULTIPLES", "PRESETS", "TRAIN_DATA", "VARIANTS", "select", "variant_patch"]
