"""The extension study: the reference GPT-2 and MiniLM, every method at 4x, untrained and after an equal
budget (quick), the best of them longer (long), against the original (``posswap study``)."""

from .plan import PHASES, PRESETS, BaseSpec, Budget, Probe, select
from .runner import Study

__all__ = ["BaseSpec", "Budget", "PHASES", "PRESETS", "Probe", "Study", "select"]
