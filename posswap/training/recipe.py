"""A recipe: the YAML file ``posswap train`` runs. Blocks ``model``, ``tokenizer``, ``posswap``, ``data``,
``train``, ``eval``, ``push_to_hub``; every key is checked (an unknown key is an error that names it) before
anything is loaded or written."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import PositionConfig, check_choice, check_positive_int, config_from_dict

TRAINABLE = ("full", "positions", "lora")
MIXED_PRECISION = ("no", "bf16", "fp16")


@dataclass
class DataSpec:
    train: str = field(default="posswap:austen-train", metadata={"help": "Training text: posswap:<split>, a local file, or NAME[:CONFIG][@SPLIT]."})
    text_column: str = "text"
    streaming: bool = field(default=False, metadata={"help": "Stream a Hub dataset larger than memory."})

    def validate(self) -> None:
        if not isinstance(self.train, str) or not self.train:
            raise ValueError("data.train must name the training text (posswap:austen-train, a file, or a Hub dataset).")


@dataclass
class LoraSpec:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0

    def validate(self) -> None:
        check_positive_int("train.lora.r", self.r)
        check_positive_int("train.lora.alpha", self.alpha)


@dataclass
class TrainSpec:
    output_dir: str = "out/posswap-run"
    max_steps: int = 1000
    batch_size: int = 1
    grad_accum: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.01
    warmup_steps: int = 0
    mixed_precision: str = "no"
    gradient_checkpointing: bool = False
    trainable: str = "full"  # full | positions | lora
    train_norms: bool = False  # with positions / lora: LayerNorms train too (LongLoRA)
    lora: LoraSpec = field(default_factory=LoraSpec)
    pose_window: int | None = None  # PoSE: train on windows this long whose position ids span max_length
    curriculum: list[int] | None = None  # window lengths, steps split evenly, e.g. [1024, 2048, 4096]
    mlm_probability: float = 0.15
    save_every: int = 100
    keep_checkpoints: int = 2
    log_every: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.lora, LoraSpec):
            self.lora = _build(LoraSpec, self.lora, "train.lora")

    def validate(self, max_length: int | None) -> None:
        for name in ("max_steps", "batch_size", "grad_accum", "save_every", "keep_checkpoints", "log_every"):
            check_positive_int(f"train.{name}", getattr(self, name))
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be an integer >= 0, got {self.warmup_steps!r}.")
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or self.lr <= 0:
            raise ValueError(f"train.lr must be a positive number, got {self.lr!r}.")
        check_choice("train.mixed_precision", self.mixed_precision, MIXED_PRECISION)
        check_choice("train.trainable", self.trainable, TRAINABLE)
        self.lora.validate()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"train.seed must be an integer >= 0, got {self.seed!r}.")
        if isinstance(self.mlm_probability, bool) or not isinstance(self.mlm_probability, (int, float)) or not 0 < self.mlm_probability < 1:
            raise ValueError(f"train.mlm_probability must be in (0, 1), got {self.mlm_probability!r}.")
        if self.pose_window is not None:
            check_positive_int("train.pose_window", self.pose_window)
            if max_length is None:
                raise ValueError("train.pose_window trains for posswap.max_length; the recipe has no posswap block.")
            if self.pose_window >= max_length:
                raise ValueError(f"train.pose_window ({self.pose_window}) must be shorter than posswap.max_length ({max_length}).")
            if self.curriculum:
                raise ValueError("train.pose_window and train.curriculum are two ways to reach the length; choose one.")
        for length in self.curriculum or []:
            check_positive_int("train.curriculum entries", length)
            if max_length is not None and length > max_length:
                raise ValueError(f"train.curriculum length {length} is longer than posswap.max_length ({max_length}).")

    def window_lengths(self, max_length: int) -> list[int]:
        """Training window length of each curriculum stage (one stage without a curriculum)."""
        if self.curriculum:
            return list(self.curriculum)
        return [self.pose_window or max_length]


@dataclass
class EvalSpec:
    lengths: list[int] = field(default_factory=list)  # empty: no evaluation
    data: str = "posswap:austen-heldout"
    max_tokens: int = 8192
    passkey_trials: int = 0
    beyond: str = "truncate"


@dataclass
class Recipe:
    model: str
    posswap: PositionConfig | None  # None: train the model as it is (baselines, pretraining)
    tokenizer: str | None = None
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    push_to_hub: str | None = None

    @property
    def max_length(self) -> int | None:
        """The patched length, or None when the model keeps its own (``posswap: null``)."""
        return self.posswap.max_length if self.posswap is not None else None


def _build(cls: type, values: Any, where: str) -> Any:
    """A dataclass from a mapping, refusing keys it does not have."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping, got {type(values).__name__}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"Unknown key(s) in {where}: {', '.join(unknown)}. Known keys: {', '.join(fields)}.")
    return cls(**values)


def recipe_from_dict(raw: dict[str, Any]) -> Recipe:
    if not isinstance(raw, dict):
        raise ValueError("A recipe must be a YAML mapping with model:, posswap:, data:, train:, eval: blocks.")
    known = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"Unknown key(s) in the recipe: {', '.join(unknown)}. Known blocks: {', '.join(sorted(known))}.")
    if not raw.get("model") or not isinstance(raw["model"], str):
        raise ValueError("The recipe needs model: (a Hub id or a local folder).")
    if raw.get("tokenizer") is not None and not isinstance(raw["tokenizer"], str):
        raise ValueError(f"tokenizer: must be a Hub id or a local folder (or left out: the model's), got {raw['tokenizer']!r}.")
    if "posswap" not in raw:
        raise ValueError("The recipe needs a posswap: block, e.g. {method: rope, max_length: 4096} (null: no patch).")
    recipe = Recipe(
        model=raw["model"],
        tokenizer=raw.get("tokenizer"),
        posswap=config_from_dict(raw["posswap"]) if raw["posswap"] is not None else None,
        data=_build(DataSpec, raw.get("data"), "data"),
        train=_build(TrainSpec, raw.get("train"), "train"),
        eval=_build(EvalSpec, raw.get("eval"), "eval"),
        push_to_hub=raw.get("push_to_hub"),
    )
    if recipe.push_to_hub is not None:
        from huggingface_hub.utils import validate_repo_id

        try:
            validate_repo_id(recipe.push_to_hub)
        except ValueError as error:  # HFValidationError is a ValueError
            raise ValueError(f"push_to_hub: bad repo id {recipe.push_to_hub!r}; use 'namespace/name'. ({error})") from None
    recipe.data.validate()
    recipe.train.validate(recipe.max_length)
    return recipe


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``train.max_steps=200`` style overrides; the value is read as YAML (numbers, lists, null)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set needs KEY=VALUE (e.g. train.max_steps=200), got {item!r}.")
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is not a block.")
        node[leaf] = yaml.safe_load(value)
    return raw


def load_recipe(path: str | Path, overrides: list[str] = ()) -> tuple[Recipe, dict[str, Any]]:
    """The validated recipe and the raw mapping it came from (saved beside checkpoints)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"No recipe file {str(path)!r}.")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:  # the parser's own message spans several lines
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise ValueError(f"Recipe {str(path)!r} is not valid YAML{where}: {problem}. Fix the file; see recipes/ for examples.") from None
    if not isinstance(raw, dict):
        raise ValueError(f"Recipe {str(path)!r} must be a YAML mapping with model:, posswap:, data:, train:, eval: blocks.")
    raw = apply_overrides(raw, list(overrides))
    return recipe_from_dict(raw), raw
