"""Base config for every position method: a dataclass that validates itself and round-trips to a dict.

Method configs (``InterpolateConfig``, ...) subclass :class:`PositionConfig` in their own file under
``posswap/methods`` and are found by name through the registry, so YAML recipes, the CLI and saved
checkpoints all go through :func:`config_from_dict`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import yaml

from .portable.posswap_block import RENAMED_IN, RENAMED_KEYS
from .portable.posswap_registry import BLOCK_CHECKS


@dataclass
class PositionConfig:
    """What every method needs: the number of tokens the patched model must read."""

    method: ClassVar[str] = ""

    max_length: int = field(metadata={"help": "Number of tokens the patched model reads (its new context length)."})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when a value cannot work: every field by the rule in its
        metadata (``portable/posswap_rules.py``); subclasses add the checks of a field against another field."""
        check_positive_int("max_length", self.max_length)
        values = self.to_dict()
        for f in dataclasses.fields(self):
            if "rule" in f.metadata:
                check_rule(f.name, getattr(self, f.name), f.metadata["rule"], values)

    def bytes_per_row(self, sites) -> int:
        """Bytes per row of the new length that the method builds besides the position-sized buffers and a kept
        table (``posswap.memory`` checks them before anything is allocated); methods that build more say so."""
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, **dataclasses.asdict(self)}


def check_positive_int(name: str, value: Any) -> None:
    # bool is an int subclass; True is not a length.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {shown(value)}.")


_COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


def check_number(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    integer: bool = False,
) -> None:
    """Refuse ``value`` unless it is a finite int or float (an int with ``integer``) within the bounds:
    ``minimum`` / ``maximum`` inclusive, ``above`` / ``below`` exclusive. bool, strings, NaN and inf are refused:
    NaN slips through every comparison (``nan < 1`` is False), and a NaN theta makes every logit NaN."""
    bounds = [(op, b) for op, b in ((">=", minimum), ("<=", maximum), (">", above), ("<", below)) if b is not None]
    limits = "".join(f" {'and ' if i else ''}{op} {b}" for i, (op, b) in enumerate(bounds))  # " > 0 and < 1"
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ValueError(f"{name} must be {kind}{limits}, got {shown(value)}.")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number{limits}, got {shown(value)}.")
    if not all(_COMPARE[op](value, b) for op, b in bounds):
        raise ValueError(f"{name} must be {kind}{limits}, got {shown(value)}.")


def check_bool(name: str, value: Any, spelled: str = "true or false") -> None:
    """Refuse ``value`` of ``name`` unless it is a bool: "no" (a hand-quoted YAML string, a string argument) would
    otherwise count as true, and 0 or None pass as false. ``spelled``: how the message writes the two values."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be {spelled}, got {shown(value)}.")


def check_flags(**flags: Any) -> None:
    """The one check of the public functions' True/False arguments (``patch(..., allow_shrink=...)``), called
    before they change anything: each must be a bool, or it is refused in one line naming it."""
    for name, value in flags.items():
        check_bool(name, value, "True or False")


def check_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {shown(value)}.")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {shown(value)}.")


def check_rule(name: str, value: Any, rule: dict, values: dict) -> None:
    """Refuse ``value`` of option ``name`` unless ``rule`` allows it (``values``: all options, for a check rule)."""
    unresolved = rule.get("before_apply", ())
    if (value is None and (rule.get("optional") or None in unresolved)) or (
        isinstance(value, str) and value in unresolved
    ):
        return
    kind = rule["kind"]
    bounds = {k: rule.get(k) for k in ("minimum", "maximum", "above", "below")}
    if kind in ("integer", "number"):
        check_number(name, value, integer=kind == "integer", **bounds)
    elif kind == "choice":
        check_choice(name, value, rule["choices"])
    elif kind == "boolean" and rule.get("optional") and not isinstance(value, bool):
        raise ValueError(f"{name} must be true, false or None (the default), got {shown(value)}.")
    elif kind == "boolean":
        check_bool(name, value)
    elif kind == "text":
        check_text(name, value)
    elif kind == "check":
        problem = BLOCK_CHECKS[rule["name"]](value, values)
        if problem:
            raise ValueError(f"{name} {problem}, got {shown(value)}.")
    else:
        raise ValueError(f"Option {name} has a rule of unknown kind {kind!r}.")


def config_from_dict(data: dict[str, Any]) -> PositionConfig:
    """Build the method config described by ``data`` (``{"method": "rope", "max_length": 4096, ...}``).

    Unknown keys are an error that names them, so a typo in a recipe never passes silently.
    """
    from .registry import get_method

    if not isinstance(data, dict):
        raise ValueError(f"A posswap config must be a mapping with a 'method' key, got {type(data).__name__}.")
    data = dict(data)
    spec = get_method(data.pop("method", None))
    known = {f.name for f in dataclasses.fields(spec.config_class)}
    unknown = sorted(set(data) - known)
    check_renamed(spec.name, unknown)
    if unknown:
        raise ValueError(
            f"Unknown key(s) {near_keys(unknown, known)} for method {spec.name!r}; its keys are: {', '.join(sorted(known))}."
        )
    if "max_length" not in data:
        raise ValueError(f"Method {spec.name!r} needs 'max_length' (the new context length in tokens).")
    return spec.config_class(**whole_numbers(spec.config_class, data))


def near_keys(unknown, known) -> str:
    """``max_step (did you mean max_steps?), foo``: each unknown key, with the known key nearest to it where one is
    near (a typo), for a message that lists them."""
    known = [str(key) for key in known]
    shown_keys = []
    for key in unknown:
        near = difflib.get_close_matches(str(key), known, n=1)
        shown_keys.append(f"{key} (did you mean {near[0]}?)" if near else str(key))
    return ", ".join(shown_keys)


def whole_numbers(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` for the fields of dataclass ``cls``, with a float that is a whole number made an int where the field
    holds integers (``int``, ``int | None``, ``list[int]``): YAML reads ``1e3`` as 1000.0. A fraction is left as it
    is, for the field's check to refuse by name."""
    hints = typing.get_type_hints(cls)
    whole = lambda value: int(value) if isinstance(value, float) and value.is_integer() else value  # noqa: E731
    converted = dict(values)
    for key, value in values.items():
        if _admits_int_only(hints.get(key)):
            converted[key] = whole(value)
        elif isinstance(value, list) and any(_admits_int_only(arg) for arg in _list_items(hints.get(key))):
            converted[key] = [whole(item) for item in value]
    return converted


def _choices(hint: Any) -> tuple:
    """The types a hint admits: ``int | None`` -> (int, NoneType)."""
    return (
        typing.get_args(hint)
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
        else (hint,)
    )


def _admits_int_only(hint: Any) -> bool:
    """An int field (maybe optional) that takes no float: a whole float there means the int."""
    choices = _choices(hint)
    return int in choices and float not in choices


def _list_items(hint: Any) -> list:
    return [typing.get_args(choice)[0] for choice in _choices(hint) if typing.get_origin(choice) is list]


def check_renamed(method: str, keys) -> None:
    """Refuse a key of ``method`` renamed since it was in posswap's docs, naming the new one (folders saved by an
    older posswap are migrated on load instead: ``portable/posswap_block.migrate_block``)."""
    for key in keys:
        new = RENAMED_KEYS.get(method, {}).get(key)
        if new is not None:
            raise ValueError(f"'{key}' was renamed '{new}' in posswap {RENAMED_IN}; use {new}.")


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = _SHOWN.maxlong = 60
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxset = 8
_SHOWN.maxdict, _SHOWN.maxlevel = 4, 3


def shown(value: Any) -> str:
    """``repr(value)`` cut to a part of a line: a message that quotes a value never spans megabytes."""
    return _SHOWN.repr(value)


# A recipe holds some dozens of values; aliases (``*name``) that stand for more than this are an alias bomb
# (nine lists of nine aliases, eight deep, are 43 million values in 400 bytes of YAML).
MAX_ALIASED_VALUES = 10_000


class YamlLoader(yaml.SafeLoader):
    """yaml.safe_load's rules, except that ``1e6``, ``3e-3`` and ``1.0e6`` are floats: YAML 1.1 wants a dot
    and a signed exponent, so ``lr: 3e-3`` would otherwise be the string '3e-3'; and aliases that stand for more
    than ``MAX_ALIASED_VALUES`` values in all are refused while the text is read, before they are expanded."""

    def compose_document(self):
        self._aliased, self._sizes = 0, {}
        return super().compose_document()

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._aliased += self._size(node)
                if self._aliased > MAX_ALIASED_VALUES:
                    raise yaml.composer.ComposerError(
                        None,
                        None,
                        f"aliases (*name) stand for more than {MAX_ALIASED_VALUES} values (an alias bomb?); write the values out",
                        event.start_mark,
                    )
        return super().compose_node(parent, index)

    def _size(self, node) -> int:
        """Values under ``node``, itself included (each node counted once per path, as expansion would)."""
        key = id(node)
        if key not in self._sizes:
            self._sizes[key] = 1  # a node that holds itself (``&a [*a]``) counts once
            if isinstance(node, yaml.SequenceNode):
                total = 1 + sum(self._size(child) for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                total = 1 + sum(self._size(k) + self._size(v) for k, v in node.value)
            else:
                total = 1
            self._sizes[key] = total
        return self._sizes[key]


YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str) -> Any:
    """Parse YAML as posswap reads it everywhere (recipes, --set values, CLI options)."""
    return yaml.load(text, Loader=YamlLoader)
