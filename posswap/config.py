"""Base config for every position method: a dataclass that validates itself and round-trips to a dict.

Method configs (``InterpolateConfig``, ...) subclass :class:`PositionConfig` in their own file under
``posswap/methods`` and are found by name through the registry, so YAML recipes, the CLI and saved
checkpoints all go through :func:`config_from_dict`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class PositionConfig:
    """What every method needs: the number of tokens the patched model must read."""

    method: ClassVar[str] = ""

    max_length: int = field(metadata={"help": "Number of tokens the patched model reads (its new context length)."})

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field when a value cannot work; subclasses extend this."""
        check_positive_int("max_length", self.max_length)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, **dataclasses.asdict(self)}


def check_positive_int(name: str, value: Any) -> None:
    # bool is an int subclass; True is not a length.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def check_choice(name: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}.")


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
    if unknown:
        raise ValueError(
            f"Unknown key(s) {', '.join(unknown)} for method {spec.name!r}; "
            f"its keys are: {', '.join(sorted(known))}."
        )
    if "max_length" not in data:
        raise ValueError(f"Method {spec.name!r} needs 'max_length' (the new context length in tokens).")
    return spec.config_class(**data)
