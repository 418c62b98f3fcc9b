"""One file per position method; importing this package registers them all."""

from . import interpolate  # noqa: F401
from . import alibi  # noqa: F401
