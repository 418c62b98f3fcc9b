"""One file per position method; importing this package registers them all."""

from . import interpolate, rope  # noqa: F401
