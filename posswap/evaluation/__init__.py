"""The language-model evaluation harness: causal-LM perplexity, masked-LM loss / accuracy, per-position loss and
passkey retrieval at each context length, the repeated-text-at-a-distance probe, position-similarity maps and plots.
Embedding models' retrieval tasks and late chunks are :mod:`posswap.embeddings`."""

from .harness import evaluate
from .repeat import repeat_probe
from .results import ModelResults, Results

__all__ = ["ModelResults", "Results", "evaluate", "repeat_probe"]
