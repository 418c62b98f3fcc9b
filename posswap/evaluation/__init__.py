"""The evaluation harness: causal-LM perplexity, masked-LM loss / accuracy, per-position loss and passkey
retrieval at each context length, the repeated-text-at-a-distance probe, position-similarity maps, plots, and
long-document retrieval for embedding models (LongEmbed's passkey and needle tasks)."""

from .harness import evaluate
from .repeat import repeat_probe
from .results import ModelResults, Results
from .retrieval import RetrievalResults, evaluate_retrieval

__all__ = ["ModelResults", "Results", "RetrievalResults", "evaluate", "evaluate_retrieval", "repeat_probe"]
