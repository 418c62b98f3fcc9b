"""The rules of a method's options as plain data, and how a saved block is checked against them.

A method's config class states each option's rule once, in its field metadata (``"rule": number(above=1)``);
posswap checks a config with it (``posswap/config.py``), and ``posswap/schema.py`` writes the rules of posswap's
methods into ``posswap_schema.py``, which saved models carry to check their ``posswap`` block (``posswap_block``).

A rule is a dict: ``kind`` (integer, number, choice, boolean, text, or check: a function registered with
``posswap_registry.block_check`` that sees the whole block), its bounds or choices, ``optional`` (None allowed),
``required`` (the run time reads the key without a default, so a saved block must have it) and ``before_apply``
(values a config may hold until the method's apply resolves them, never saved: ``scale="match"``).

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import json
import math
import operator
from typing import Any

from .posswap_registry import BLOCK_CHECKS

COMPARE = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
BOUNDS = (("minimum", ">="), ("maximum", "<="), ("above", ">"), ("below", "<"))


def _rule(kind: str, optional: bool, required: bool, before_apply: tuple, **values) -> dict:
    rule = {"kind": kind, **{k: v for k, v in values.items() if v is not None}}
    rule.update({k: v for k, v in (("optional", optional), ("required", required)) if v})
    if before_apply:
        rule["before_apply"] = tuple(before_apply)
    return rule


def integer(minimum=None, maximum=None, *, optional=False, required=False) -> dict:
    return _rule("integer", optional, required, (), minimum=minimum, maximum=maximum)


def number(minimum=None, maximum=None, *, above=None, below=None, optional=False, required=False, before_apply=()):
    return _rule("number", optional, required, before_apply, minimum=minimum, maximum=maximum, above=above, below=below)


def choice(*choices, optional=False, required=False) -> dict:
    return _rule("choice", optional, required, (), choices=tuple(choices))


def boolean(*, optional=False, required=False, before_apply=()) -> dict:
    return _rule("boolean", optional, required, before_apply)


def text(*, optional=False, required=False) -> dict:
    return _rule("text", optional, required, ())


def check(name: str, *, optional=False, required=False) -> dict:
    """A rule that one kind cannot say (a key bounded by another): ``name`` is a function registered with
    ``posswap_registry.block_check`` in the method's run-time module."""
    return _rule("check", optional, required, (), name=name)


def bounds(rule: dict) -> list[tuple[str, Any]]:
    return [(op, rule[key]) for key, op in BOUNDS if rule.get(key) is not None]


def limits(rule: dict) -> str:
    """The rule's bounds as the messages say them: ``" >= 4 and <= 65536"``."""
    return "".join(f" {'and ' if i else ''}{op} {b}" for i, (op, b) in enumerate(bounds(rule)))


def within(value, rule: dict) -> bool:
    return all(COMPARE[op](value, b) for op, b in bounds(rule))


def _integer_problem(value, rule: dict, block: dict) -> str | None:
    ok = not isinstance(value, bool) and isinstance(value, int) and within(value, rule)
    return None if ok else f"must be an integer{limits(rule)}"


def _number_problem(value, rule: dict, block: dict) -> str | None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    return None if ok and within(value, rule) else f"must be a finite number{limits(rule)}"


def _choice_problem(value, rule: dict, block: dict) -> str | None:
    choices = (None, *rule["choices"]) if rule.get("optional") else rule["choices"]
    return None if value in choices else f"must be one of {', '.join(map(repr, choices))}"


def _boolean_problem(value, rule: dict, block: dict) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def _text_problem(value, rule: dict, block: dict) -> str | None:
    return None if isinstance(value, str) else "must be a string"


def _check_problem(value, rule: dict, block: dict) -> str | None:
    return BLOCK_CHECKS[rule["name"]](value, block)


PROBLEMS = {
    "integer": _integer_problem,
    "number": _number_problem,
    "choice": _choice_problem,
    "boolean": _boolean_problem,
    "text": _text_problem,
    "check": _check_problem,
}


def block_problem(value, rule: dict, block: dict) -> str | None:
    """What is wrong with ``value`` as a saved block's value under ``rule`` ("must be ..."), or None."""
    if value is None and rule.get("optional"):
        return None
    problem = PROBLEMS[rule["kind"]](value, rule, block)
    if problem and rule.get("optional") and rule["kind"] != "choice":
        problem += " (or null)"
    return problem


def literal(value) -> str:
    """``value`` (str, number, bool, None, tuple, dict of those) as Python source, in ruff's format."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    if isinstance(value, tuple):
        return "(" + ", ".join(map(literal, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, str):
        return json.dumps(value)
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    raise TypeError(f"A rule holds plain data only, not {type(value).__name__}: {value!r}.")
