"""One file per position method; importing this package registers them all."""

from . import alibi, interpolate, nope, rope, sinusoidal, t5_bias, tupe  # noqa: F401
