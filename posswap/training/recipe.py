"""A recipe: the YAML file ``posswap train`` runs. Blocks ``model``, ``tokenizer``, ``posswap``, ``data``,
``train``, ``eval``, ``push_to_hub``; every key is checked (an unknown key is an error that names it) before
anything is loaded or written."""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..config import (
    PositionConfig,
    check_bool,
    check_choice,
    check_number,
    check_positive_int,
    check_text,
    config_from_dict,
    load_yaml,
    near_keys,
    shown,
    whole_numbers,
)
from ..embeddings.training.recipe import EmbeddingSpec, check_embedding_recipe
from ..evaluation.harness import check_settings
from ..shipped_recipes import LocalRecipePassedOver, find_recipe
from .distill import DistillSpec

TRAINABLE = ("full", "positions", "lora", "head")
MIXED_PRECISION = ("no", "bf16", "fp16")


@dataclass
class DataSpec:
    train: str = field(
        default="posswap:austen-train",
        metadata={"help": "Training text: posswap:<split>, a local file, or NAME[:CONFIG][@SPLIT]."},
    )
    text_column: str = "text"
    streaming: bool = field(default=False, metadata={"help": "Stream a Hub dataset larger than memory."})
    # Copying must be learned before a model can show that it reads distant tokens (the repeat probe); natural
    # text repeats too rarely for a small model to learn it, so this share of windows gets a span copied further on.
    repeat_fraction: float = 0.0
    repeat_span: int = 64

    def validate(self) -> None:
        if not isinstance(self.train, str) or not self.train:
            raise ValueError("data.train must name the training text (posswap:austen-train, a file, or a Hub dataset).")
        check_text("data.text_column", self.text_column)
        check_bool("data.streaming", self.streaming)
        check_number("data.repeat_fraction", self.repeat_fraction, minimum=0, maximum=1)
        check_positive_int("data.repeat_span", self.repeat_span)

    def check_window(self, length: int) -> None:
        """A window must hold a span and its copy."""
        if self.repeat_fraction > 0 and length < 2 * self.repeat_span:
            raise ValueError(
                f"data.repeat_span ({self.repeat_span}) must be at most half the training window ({length} tokens); "
                "shorten it or set data.repeat_fraction: 0."
            )


@dataclass
class LoraSpec:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0

    def validate(self) -> None:
        check_positive_int("train.lora.r", self.r)
        check_positive_int("train.lora.alpha", self.alpha)
        check_number("train.lora.dropout", self.dropout, minimum=0, below=1)


@dataclass
class TrainSpec:
    output_dir: str = "out/posswap-run"
    max_steps: int = 1000
    batch_size: int = 1
    grad_accum: int = 1
    lr: float = 1e-4
    position_lr: float | None = None  # position parameters (table, T5 buckets, TUPE) at their own rate; None: lr
    weight_decay: float = 0.01
    warmup_steps: int = 0
    mixed_precision: str = "no"
    gradient_checkpointing: bool = False
    trainable: str = "full"  # full | positions | lora | head
    train_norms: bool = False  # with positions / lora: LayerNorms train too (LongLoRA)
    lora: LoraSpec = field(default_factory=LoraSpec)
    distill: DistillSpec = field(default_factory=DistillSpec)  # the unpatched model as teacher: training/distill.py
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
        if not isinstance(self.distill, DistillSpec):
            self.distill = _build(DistillSpec, self.distill, "train.distill")

    def validate(self, max_length: int | None) -> None:
        check_text("train.output_dir", self.output_dir)
        for name in ("max_steps", "batch_size", "grad_accum", "save_every", "keep_checkpoints", "log_every"):
            check_positive_int(f"train.{name}", getattr(self, name))
        check_number("train.warmup_steps", self.warmup_steps, minimum=0, integer=True)
        check_number("train.lr", self.lr, above=0)
        if self.position_lr is not None:
            check_number("train.position_lr", self.position_lr, above=0)
        check_number("train.weight_decay", self.weight_decay, minimum=0)
        check_number("train.mlm_probability", self.mlm_probability, above=0, below=1)
        check_number("train.seed", self.seed, minimum=0, maximum=2**32 - 1, integer=True)  # numpy's seed range
        check_choice("train.mixed_precision", self.mixed_precision, MIXED_PRECISION)
        check_choice("train.trainable", self.trainable, TRAINABLE)
        check_bool("train.gradient_checkpointing", self.gradient_checkpointing)
        check_bool("train.train_norms", self.train_norms)
        self.lora.validate()
        self.distill.validate()
        self._validate_lengths(max_length)

    def _validate_lengths(self, max_length: int | None) -> None:
        """PoSE and the curriculum: two ways to reach posswap.max_length, each shorter than it."""
        if self.pose_window is not None:
            check_positive_int("train.pose_window", self.pose_window)
            if max_length is None:
                raise ValueError("train.pose_window trains for posswap.max_length; the recipe has no posswap block.")
            if self.pose_window >= max_length:
                raise ValueError(
                    f"train.pose_window ({self.pose_window}) must be shorter than posswap.max_length ({max_length})."
                )
            if self.curriculum:
                raise ValueError("train.pose_window and train.curriculum are two ways to reach the length; choose one.")
        if self.curriculum is not None and not isinstance(self.curriculum, list):
            raise ValueError(f"train.curriculum must be a list of window lengths, got {shown(self.curriculum)}.")
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

    def validate(self) -> None:
        no_eval = self.lengths in ([], None)  # the other keys are checked all the same
        check_settings(
            [2] if no_eval else self.lengths, self.beyond, None, self.max_tokens, self.passkey_trials, prefix="eval."
        )
        check_text("eval.data", self.data)


@dataclass
class Recipe:
    model: str
    posswap: PositionConfig | None  # None: train the model as it is (baselines, pretraining)
    tokenizer: str | None = None
    data: DataSpec = field(default_factory=DataSpec)
    train: TrainSpec = field(default_factory=TrainSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    push_to_hub: str | None = None
    embedding: EmbeddingSpec | None = None  # set: a sentence-transformers model trained on (passage, document) pairs
    # The file it was read from (shipped_recipes.RecipeFile), set by load_recipe; None when built in Python. Not a
    # field: no key of the recipe, and not part of to_dict.
    source = None

    @property
    def max_length(self) -> int | None:
        """The patched length, or None when the model keeps its own (``posswap: null``)."""
        return self.posswap.max_length if self.posswap is not None else None

    def validate(self) -> None:
        """Every value, before anything is loaded: types and ranges (files: :meth:`check_sources`)."""
        if not self.model or not isinstance(self.model, str):
            raise ValueError("The recipe needs model: (a Hub id or a local folder).")
        if self.tokenizer is not None:
            check_text("tokenizer", self.tokenizer)
        if self.posswap is not None:
            self.posswap.validate()
        if self.push_to_hub is not None:
            from huggingface_hub.utils import validate_repo_id

            check_text("push_to_hub", self.push_to_hub)
            try:
                validate_repo_id(self.push_to_hub)
            except ValueError as error:  # HFValidationError is a ValueError; it quotes the whole id, which may be long
                reason = str(error).replace(repr(self.push_to_hub), "it").replace(self.push_to_hub, "it")
                raise ValueError(
                    f"push_to_hub: bad repo id {shown(self.push_to_hub)}; use 'namespace/name'. ({reason})"
                ) from None
        self.data.validate()
        self.train.validate(self.max_length)
        self.eval.validate()
        if self.max_length is not None:
            self.check_windows(self.max_length)
        if self.embedding is not None:
            self.embedding.validate(self.max_length)
            check_embedding_recipe(self, Recipe(model="", posswap=None))

    def check_windows(self, max_length: int) -> None:
        """Each training window holds a repeated span and its copy (``max_length``: the patched length, or
        with ``posswap: null`` the model's own, known once it is loaded)."""
        for length in self.train.window_lengths(max_length):
            self.data.check_window(length)

    def check_sources(self) -> None:
        """The local model, tokenizer and data files exist (Hub ids are left to the Hub). Separate from
        :meth:`validate` because a recipe may name a folder that is built after it is read (the study's
        reference init); ``train`` calls it before it loads or writes anything."""
        check_model_source("model", self.model, need_config=True)
        if self.tokenizer is not None:
            check_model_source("tokenizer", self.tokenizer, need_config=False)
        check_data_source("data.train", self.data.train)
        check_text_column(self.data.train, self.data.text_column)
        if self.eval.lengths:
            check_data_source("eval.data", self.eval.data)

    def to_dict(self) -> dict[str, Any]:
        """The resolved recipe (defaults filled in), as JSON can hold it: what a run folder keeps to check --resume."""
        as_dict = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        as_dict.update({name: dataclasses.asdict(getattr(self, name)) for name in ("data", "train", "eval")})
        as_dict["posswap"] = self.posswap.to_dict() if self.posswap is not None else None
        as_dict["embedding"] = dataclasses.asdict(self.embedding) if self.embedding is not None else None
        return as_dict


def looks_local(name_or_path: str) -> bool:
    """A path rather than a Hub id: it starts like one, or it (or its first part, e.g. ``out/``) exists here."""
    first = Path(name_or_path).parts[0] if Path(name_or_path).parts else name_or_path
    return name_or_path.startswith(("./", "../", "/", "~")) or Path(name_or_path).exists() or Path(first).exists()


def check_model_source(name: str, value: str, need_config: bool) -> None:
    from ..loading import EMBEDDED_MODELS

    if value.startswith("posswap:"):
        if value not in EMBEDDED_MODELS:
            raise ValueError(f"{name}: no embedded model {value!r}; embedded models: {', '.join(EMBEDDED_MODELS)}.")
        return
    if not looks_local(value):
        return
    path = Path(value).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"{name}: no local folder {value!r} (a Hub id has no leading ./ ../ / and names no local folder)."
        )
    if need_config and not (path / "config.json").is_file():
        raise ValueError(f"{name}: {value!r} has no config.json; give a folder that save_pretrained wrote.")


def check_data_source(name: str, value: str) -> None:
    from ..data.splits import EMBEDDED_PREFIX, LOCAL_SUFFIXES, SPLITS

    if value.startswith(EMBEDDED_PREFIX):
        if value[len(EMBEDDED_PREFIX) :] not in SPLITS:
            raise ValueError(
                f"{name}: no embedded split {value!r}; use one of {', '.join(EMBEDDED_PREFIX + s for s in SPLITS)}."
            )
        return
    if not looks_local(value):
        return
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"{name}: no local file {value!r}.")
    if path.suffix not in LOCAL_SUFFIXES:
        raise ValueError(f"{name}: cannot read {value!r}; use a {', '.join(LOCAL_SUFFIXES)} file.")
    if path.suffix in (".txt", ".jsonl", ".json"):
        check_text_file(name, path)


def check_text_column(spec: str, column: str) -> None:
    """An embedded split or a ``.txt`` file has one text column, ``text``: another name is refused now, not as
    datasets' "Column 'x' doesn't exist" (no key named) once the model is loaded."""
    from ..data.splits import EMBEDDED_PREFIX

    if column != "text" and (spec.startswith(EMBEDDED_PREFIX) or (looks_local(spec) and spec.endswith(".txt"))):
        raise ValueError(f"data.text_column: {spec!r} has one text column, 'text'; got {shown(column)}. Remove it.")


def check_text_file(name: str, path: Path) -> None:
    """A text file ``datasets`` would fail on deep inside its builder (exit 1, no file named): bytes that are not
    UTF-8, a NUL byte (a binary file), and for ``.jsonl`` a line that is not a JSON object. Named with file and line."""
    jsonl = path.suffix == ".jsonl"
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{name}: {path} is not UTF-8 text: byte 0x{line[error.start]:02x} on line {number} (column "
                    f"{error.start + 1}); save the file as UTF-8."
                ) from None
            if "\0" in text:
                raise ValueError(f"{name}: {path} looks binary (a NUL byte on line {number}); give a UTF-8 text file.")
            if jsonl and text.strip():
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as error:
                    raise ValueError(
                        f"{name}: {path} line {number} is not valid JSON: {error.msg} (column {error.colno}); "
                        "fix or remove that line (one JSON object per line)."
                    ) from None
                if not isinstance(row, dict):
                    raise ValueError(
                        f"{name}: {path} line {number} is not a JSON object but {type(row).__name__}; "
                        'write one object per line, e.g. {"text": "..."}.'
                    )


def _build(cls: type, values: Any, where: str) -> Any:
    """A dataclass from a mapping, refusing keys it does not have."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ValueError(f"{where} must be a mapping, got {type(values).__name__}.")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"Unknown key(s) in {where}: {near_keys(unknown, fields)}. Known keys: {', '.join(fields)}.")
    return cls(**whole_numbers(cls, values))


def recipe_from_dict(raw: dict[str, Any]) -> Recipe:
    if not isinstance(raw, dict):
        raise ValueError("A recipe must be a YAML mapping with model:, posswap:, data:, train:, eval: blocks.")
    known = {f.name for f in dataclasses.fields(Recipe)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(
            f"Unknown key(s) in the recipe: {near_keys(unknown, known)}. Known blocks: {', '.join(sorted(known))}."
        )
    if "posswap" not in raw:
        raise ValueError("The recipe needs a posswap: block, e.g. {method: rope, max_length: 4096} (null: no patch).")
    recipe = Recipe(
        model=raw.get("model"),
        tokenizer=raw.get("tokenizer"),
        posswap=config_from_dict(raw["posswap"]) if raw["posswap"] is not None else None,
        data=_build(DataSpec, raw.get("data"), "data"),
        train=_build(TrainSpec, raw.get("train"), "train"),
        eval=_build(EvalSpec, raw.get("eval"), "eval"),
        push_to_hub=raw.get("push_to_hub"),
        embedding=_build(EmbeddingSpec, raw["embedding"], "embedding") if raw.get("embedding") is not None else None,
    )
    recipe.validate()
    return recipe


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``train.max_steps=200`` style overrides; the value is read as YAML (numbers, lists, null)."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set needs KEY=VALUE (e.g. train.max_steps=200), got {shown(item)}.")
        node = raw
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part!r} is not a block.")
        try:
            node[leaf] = load_yaml(value)
        except yaml.YAMLError as error:  # the parser's own message spans several lines and quotes the text
            problem = getattr(error, "problem", None) or type(error).__name__
            raise ValueError(f"--set {key}: the value is not valid YAML: {problem}.") from None
    return raw


def load_recipe(path: str | Path, overrides: list[str] = ()) -> tuple[Recipe, dict[str, Any]]:
    """The validated recipe and the raw mapping it came from (saved beside checkpoints). ``path``: a YAML file, or
    the name of a recipe that ships with posswap (``minilm-embed-2k``; ``posswap train --list`` lists them): a bare
    name is the shipped recipe even where the working folder has ``NAME.yaml`` (a warning says so; ``./NAME.yaml``
    reads that file). The recipe's ``source`` says which file it is."""
    source = find_recipe(path)
    if source.passed_over is not None:
        warnings.warn(source.describe(), LocalRecipePassedOver, stacklevel=2)
    path = source.path
    try:
        raw = load_yaml(path.read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as error:  # the parser's own message spans several lines
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise ValueError(
            f"Recipe {str(path)!r} is not valid YAML{where}: {problem}. Fix the file; see recipes/ for examples."
        ) from None
    if not isinstance(raw, dict):
        raise ValueError(
            f"Recipe {str(path)!r} must be a YAML mapping with model:, posswap:, data:, train:, eval: blocks."
        )
    raw = apply_overrides(raw, list(overrides))
    recipe = recipe_from_dict(raw)
    recipe.source = source
    return recipe, raw


# Keys that may change between a run and its --resume: they decide what is logged, kept, evaluated or pushed
# (or, for gradient_checkpointing, how memory is traded for compute), not the weights the steps produce.
# Not max_steps: the cosine schedule and the curriculum stages are laid out over it, so raising it to
# continue would not give the run that max_steps names.
RESUME_FREE_KEYS = (
    "train.output_dir",
    "train.log_every",
    "train.save_every",
    "train.keep_checkpoints",
    "train.gradient_checkpointing",
    "eval",
    "push_to_hub",
    "recipe_file",  # where the recipe was read from (recipe.json records it): the same recipe, by another path
)


def recipe_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``block.key (old -> new)`` for each key of two :meth:`Recipe.to_dict` mappings that differs and can
    change the trained weights."""
    # A key added to posswap after the old run was made counts as its default there.
    defaults = _flatten(json.loads(json.dumps(Recipe(model="", posswap=None).to_dict())))
    old, new = {**defaults, **_flatten(old)}, {**defaults, **_flatten(new)}
    missing = object()
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k, missing) != new.get(k, missing))
    free = [k for k in changed if any(k == f or k.startswith(f + ".") for f in RESUME_FREE_KEYS)]
    return [f"{k} ({old.get(k, '<unset>')!r} -> {new.get(k, '<unset>')!r})" for k in changed if k not in free]


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat
