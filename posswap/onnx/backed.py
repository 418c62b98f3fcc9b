"""A sentence-transformers model whose transformer runs an exported graph (``posswap export --format onnx``) with
onnxruntime: every task that takes a ``SentenceTransformer`` (posswap's retrieval tasks, late chunks) then scores
the graph, float or int8, with the same tokenizer, pooling and chunk spans as the torch model it came from.

    model = with_onnx_graph(posswap.from_pretrained("out/minilm-late-2k/model"), "onnx-out/onnx/model_qint8.onnx")

This is what measures what the int8 graph costs on retrieval; serving goes through ``OnnxEncoder`` (no torch).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput

from ..sentence_models import transformer_module
from .export import session


class OnnxTransformerModel(nn.Module):
    """Stands where a ``Transformer`` module's transformers model stood: the same inputs, the graph's token outputs
    as ``last_hidden_state``. Inference only (no gradients flow through onnxruntime)."""

    def __init__(self, graph: str | os.PathLike, config: Any):
        super().__init__()
        self.config, self.graph = config, Path(graph)
        self.session = session(self.graph)  # as many threads as torch has, as the export's own check runs it
        self.inputs = [i.name for i in self.session.get_inputs()]

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, **_ignored) -> BaseModelOutput:
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        if given["token_type_ids"] is None:
            given["token_type_ids"] = torch.zeros_like(input_ids)
        feed = {name: given[name].detach().cpu().long().numpy() for name in self.inputs}
        tokens = torch.from_numpy(self.session.run(None, feed)[0]).to(input_ids.device)
        return BaseModelOutput(last_hidden_state=tokens)

    def __getstate__(self):  # an InferenceSession does not pickle: a copy opens the graph again
        state = dict(self.__dict__)
        state.pop("session")
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.session = session(self.graph)


def with_onnx_graph(model: nn.Module, graph: str | os.PathLike) -> nn.Module:
    """``model`` (a sentence-transformers model on the CPU) with its transformer replaced, in place, by the graph at
    ``graph``; returned. The graph must be an export of this model: its inputs and width are checked on a probe."""
    graph = Path(graph)
    if not graph.is_file():
        raise ValueError(f"graph: no file at {graph}; give the .onnx file posswap export wrote (onnx/model.onnx).")
    module = transformer_module(model)
    runner = OnnxTransformerModel(graph, module.auto_model.config)
    missing = set(runner.inputs) - {"input_ids", "attention_mask", "token_type_ids"}
    if missing:
        raise ValueError(f"graph: {graph} asks for inputs {sorted(missing)}, which a text encoder does not give.")
    probe = torch.tensor([[model.tokenizer.cls_token_id or 0, model.tokenizer.sep_token_id or 0]])
    width = runner(input_ids=probe, attention_mask=torch.ones_like(probe)).last_hidden_state.shape[-1]
    if width != module.auto_model.config.hidden_size:
        raise ValueError(
            f"graph: {graph} gives {width}-wide token outputs and the model {module.auto_model.config.hidden_size}: "
            "export this model's folder (posswap export FOLDER --format onnx)."
        )
    module.model = runner
    return model
