"""One file per position method; importing this package registers them all."""

# Registration order is the order of the study's variants and of the CLI help.
from . import interpolate, rope, alibi, sinusoidal, nope, t5_bias, tupe  # noqa: F401, I001
