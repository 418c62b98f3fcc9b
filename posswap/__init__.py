"""posswap: swap the learned position table of pretrained BERT-family and GPT-2 checkpoints for one that reaches
further (a longer table, RoPE, ALiBi, T5 bias, TUPE, a fixed sinusoid or none), then train, evaluate and share the
result."""

import importlib
import importlib.util

from .version import __version__ as __version__

# Public name -> the module that defines it. Each is imported on first use (``posswap.patch``, ``from posswap import
# RopeConfig``), so ``import posswap`` costs nothing and a user pays for what they use: a config brings torch, the
# training names bring datasets and accelerate.
_WHERE = {
    "ARCHITECTURES": "portable.posswap_architectures",
    "PositionConfig": "config",
    "Results": "evaluation",
    "config_from_dict": "config",
    "evaluate": "evaluation",
    "export": "export",
    "from_pretrained": "loading",
    "late_chunk_pieces": "evaluation.late_chunking",
    "late_chunks": "evaluation.late_chunking",
    "load_recipe": "training",
    "model_card": "hub",
    "patch": "patching",
    "patched_config": "patching",
    "push_to_hub": "hub",
    "split_text": "evaluation.text_pieces",
    "train": "training",
}
# Each method's config class, from the methods' index (generated: posswap/methods/index.py).
_CONFIGS = {
    "AlibiConfig": "methods.alibi",
    "InterpolateConfig": "methods.interpolate",
    "NopeConfig": "methods.nope",
    "RopeConfig": "methods.rope",
    "SinusoidalConfig": "methods.sinusoidal",
    "T5BiasConfig": "methods.t5_bias",
    "TupeConfig": "methods.tupe",
}

__all__ = sorted([*_WHERE, *_CONFIGS, "__version__"], key=lambda name: (not name[0].isupper(), name.lower()))

# Names that were in the README of an earlier posswap -> their names now.
_RENAMED = {"NoPEConfig": "NopeConfig", "functional": "portable.posswap_functional"}


def __getattr__(name: str):
    where = _WHERE.get(name) or _CONFIGS.get(name)
    if where is not None:
        if name == "config_from_dict":  # it finds any method by name: every method registered first
            importlib.import_module(".methods", __name__)
        value = getattr(importlib.import_module(f".{where}", __name__), name)
        globals()[name] = value  # found once: the next use is a plain attribute
        return value
    if name in _RENAMED:
        raise AttributeError(f"posswap.{name} was renamed posswap.{_RENAMED[name]}; use posswap.{_RENAMED[name]}.")
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)  # a submodule, as before any was imported
    raise AttributeError(f"module 'posswap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
