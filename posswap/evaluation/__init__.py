"""The evaluation harness: causal-LM perplexity, masked-LM loss / accuracy, per-position loss and passkey
retrieval at each context length, position-similarity maps, and plots."""

from .harness import evaluate
from .results import ModelResults, Results

__all__ = ["ModelResults", "Results", "evaluate"]
