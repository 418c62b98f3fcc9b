"""The ONNX graph of a posswap model: the plain transformers model with the patched weights, and what posswap runs
at call time written into the graph, so that onnxruntime needs no code of posswap's.

What can be put in a graph today: a patch that only changed weights (a resized ``interpolate`` table, a fixed
``sinusoidal`` one) and ``interpolate`` with ``exact_short_inputs``, whose rule (a row of at most
``original_length`` real tokens reads position k * i) is computed from the attention mask in the graph with
``torch.where`` (``portable/posswap_placement.short_input_position_ids``, the function the torch model runs).
The methods that change attention (ALiBi, T5 bias, TUPE, RoPE, NoPE) run their graph forms (``methods.py``): the
bias and the rotation computed in the graph from each call's positions, added to the mask of the standard attention.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path

import torch
import transformers
from torch import nn

from ..patching import CONFIG_KEY
from ..portable.posswap_architectures import find_sites
from ..portable.posswap_placement import short_input_position_ids
from ..portable.posswap_runtime import needs_runtime_code
from .attention import use_multi_head_attention
from .methods import adds_bias, graph_refusal, install_graph_form

OPSET = 23  # attention as one standard Attention node, which attention.py hands to onnxruntime's kernel
# methods whose run-time code has a graph form here (see module docstring)
IN_GRAPH = ("interpolate", "sinusoidal", "nope", "alibi", "t5-bias", "rope", "tupe")


def onnx_refusal(model: nn.Module) -> str | None:
    """None when ``model`` (a transformers model) can be written as an ONNX graph; else the one-line reason."""
    if getattr(model.config, "is_encoder_decoder", False):
        return (
            f"{model.config.model_type} is an encoder-decoder, whose generation (the decoder with its cache, over the "
            "encoder's output) has no graph here; serve it with torch"
        )
    block = getattr(model.config, CONFIG_KEY, None)
    if not isinstance(block, dict):
        return None  # a stock model
    method = block.get("method")
    if not needs_runtime_code(block):
        return None
    if method in IN_GRAPH:
        reason = graph_refusal(block)
        return None if reason is None else f"method {method!r}: {reason}"
    return (
        f"method {method!r} runs posswap's attention code at call time, which has no ONNX form yet "
        f"(exportable: {', '.join(IN_GRAPH)}, and methods that only change weights)"
    )


def native_model(model: nn.Module) -> nn.Module:
    """A plain transformers model of ``model``'s class with its weights: no posswap hooks, nothing patched."""
    fields = model.config.to_dict()
    for key in (CONFIG_KEY, "auto_map", "architectures", "transformers_version"):
        fields.pop(key, None)
    native_type = fields.pop("model_type").removeprefix("posswap-")
    config = transformers.CONFIG_MAPPING[native_type](**fields)
    cls = getattr(transformers, type(model).__name__.removeprefix("Posswap"))
    config.architectures = [cls.__name__]
    native = cls(config)
    install_graph_form(model, native)  # the method's table, providers and attention, before the weights load
    native = native.to(next(model.parameters()).dtype).eval()
    missing, unexpected = native.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if k not in set(getattr(native, "_tied_weights_keys", None) or {})]
    if missing or unexpected:
        raise ValueError(f"Weights do not map onto {cls.__name__}: missing {missing}, unexpected {unexpected}.")
    return native


class Graph(nn.Module):
    """What the ONNX graph computes: token ids (+ mask, token types) -> the model's first output, with the
    short-input placement of ``exact_short_inputs`` in the graph."""

    def __init__(self, native: nn.Module, block: dict | None, offset: int, output: str):
        super().__init__()
        self.native, self.offset, self.output = native, offset, output
        self.block = block if block and block.get("exact_short_inputs") else None

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        if self.block is not None:
            c = self.native.config
            extra["position_ids"] = short_input_position_ids(
                input_ids, attention_mask, self.block, self.offset, c.max_position_embeddings, c.pad_token_id
            )
        out = self.native(input_ids=input_ids, attention_mask=attention_mask, **extra)
        return getattr(out, self.output)


def output_name(model: nn.Module) -> str:
    """Optimum's names: ``last_hidden_state`` for a bare transformer, ``logits`` for a head."""
    return "last_hidden_state" if model.base_model is model else "logits"


def input_names(tokenizer) -> list[str]:
    names = ["input_ids", "attention_mask"]
    return names + (["token_type_ids"] if "token_type_ids" in tokenizer.model_input_names else [])


@contextlib.contextmanager
def quiet_exporter():
    """torch's exporter talks about what a user can do nothing about (torchvision's absent ops, dynamic axes it
    merged, a deprecated pytree class): kept out of ``posswap export``'s output. Errors still raise."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
            warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def write_graph(model: nn.Module, native: nn.Module, tokenizer, path: Path) -> list[str]:
    """Export ``native`` (:func:`native_model` of ``model``, checked with :func:`onnx_refusal`) to ``path`` with
    ``model``'s run-time rule; dynamic batch and sequence length up to ``max_position_embeddings``. Returns the
    graph's input names."""
    block = getattr(model.config, CONFIG_KEY, None)
    sites = find_sites(model)
    graph = Graph(native, block, sites.offset if isinstance(block, dict) else 0, output_name(model)).eval()
    names = input_names(tokenizer)
    sample = tokenizer(["a b c d"] * 2, return_tensors="pt")  # no padding: GPT-2's tokenizer has no pad token
    batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence", max=model.config.max_position_embeddings)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), quiet_exporter():
        program = torch.onnx.export(
            graph,
            tuple(sample[name] for name in names),
            input_names=names,
            output_names=[graph.output],
            dynamic_shapes=tuple({0: batch, 1: length} for _ in names),
            dynamo=True,
            optimize=True,
            opset_version=OPSET,
            verbose=False,
        )
    program.save(str(path))
    # A decoder's causal Attention node stays as the exporter wrote it, and so does one whose mask carries a bias.
    if not sites.arch.causal and not adds_bias(native):
        use_multi_head_attention(path, model.config.num_attention_heads)
    return names
