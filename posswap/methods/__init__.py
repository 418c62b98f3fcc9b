"""One file per position method; importing this package registers them all."""

from . import alibi, interpolate, rope, tupe  # noqa: F401
