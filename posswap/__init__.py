"""posswap: swap the learned position table of pretrained BERT-family and GPT-2 checkpoints for one that reaches
further (a longer table, RoPE, ALiBi, T5 bias, TUPE, a fixed sinusoid or none), then train, evaluate and share the
result."""

from . import methods  # noqa: F401  (registers every method)
from .config import PositionConfig, config_from_dict
from .evaluation import Results, evaluate
from .evaluation.late_chunking import late_chunk_pieces, late_chunks
from .evaluation.text_pieces import split_text
from .export import export
from .hub import model_card, push_to_hub
from .loading import from_pretrained
from .methods.alibi import AlibiConfig
from .methods.interpolate import InterpolateConfig
from .methods.nope import NopeConfig
from .methods.rope import RopeConfig
from .methods.sinusoidal import SinusoidalConfig
from .methods.t5_bias import T5BiasConfig
from .methods.tupe import TupeConfig
from .patching import patch, patched_config
from .portable.posswap_architectures import ARCHITECTURES
from .version import __version__

__all__ = [
    "AlibiConfig",
    "ARCHITECTURES",
    "InterpolateConfig",
    "NopeConfig",
    "PositionConfig",
    "Results",
    "RopeConfig",
    "SinusoidalConfig",
    "T5BiasConfig",
    "TupeConfig",
    "__version__",
    "config_from_dict",
    "evaluate",
    "export",
    "from_pretrained",
    "late_chunk_pieces",
    "late_chunks",
    "load_recipe",
    "model_card",
    "patch",
    "patched_config",
    "push_to_hub",
    "split_text",
    "train",
]

# Names that were in the README of an earlier posswap -> their names now.
_RENAMED = {"NoPEConfig": "NopeConfig", "functional": "portable.posswap_functional"}


# Public, but imported on first use: the training code brings datasets and accelerate, which patching and loading
# never need (``from posswap import train`` works as for any other name).
_LAZY = {"train": "training", "load_recipe": "training"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in _RENAMED:
        raise AttributeError(f"posswap.{name} was renamed posswap.{_RENAMED[name]}; use posswap.{_RENAMED[name]}.")
    raise AttributeError(f"module 'posswap' has no attribute {name!r}")
