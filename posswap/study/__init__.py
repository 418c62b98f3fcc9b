"""The extension study: the reference GPT-2 and MiniLM, every method at 4x, untrained and after an equal
budget, against the original (``posswap study``)."""

from .plan import PRESETS, BaseSpec, Budget, select
from .runner import Study

__all__ = ["BaseSpec", "Budget", "PRESETS", "Study", "select"]
