"""``posswap export FOLDER --format onnx --out OUT``: a posswap model as an ONNX graph that onnxruntime runs with
no code of posswap's (``graph.py`` says what goes into the graph).

A sentence-transformers folder is written in sentence-transformers' own ONNX layout: its module configs and
tokenizer, a native ``config.json`` and the graph at ``onnx/model.onnx`` (``onnx/model_qint8.onnx`` too with
``int8``), with no torch weights, so a torch load of OUT fails instead of running the model without the rule in its
graph. A transformers folder gets optimum's layout: ``model.onnx`` beside ``config.json`` and the tokenizer. The graph
is run with onnxruntime on probe inputs and compared with the torch model before the folder is moved into place.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..export import check_model_files
from ..extras import require
from ..files import check_folder_target, write_folder
from ..patching import CONFIG_KEY

TOLERANCE = 1e-4  # max |difference| of the float graph's outputs from the torch model's, on the probes
EXPORT_KEY = "posswap_onnx"  # config.json: what was exported (not "posswap": that key means "patch me")
POSSWAP_FILES = ("model.safetensors", "modeling_posswap.py", "README.md")  # what save wrote that OUT must not have


@dataclass
class OnnxExported:
    path: Path
    graphs: list[str]  # paths of the graphs written, relative to ``path``
    max_difference: float  # float graph against the torch model
    layout: str  # "sentence-transformers" or "transformers"
    int8_cosine: dict[int, float] = field(default_factory=dict)  # probe length -> int8 cosine to float (mean)


def require_onnx() -> None:
    """The onnx extra, before any work (``graph`` imports onnx, so it is imported after this)."""
    require("onnx", "onnx", "onnxruntime", "onnxscript", needed_for="ONNX export")  # onnxscript: torch.onnx's exporter


def export_onnx(
    name_or_path: str | os.PathLike, out: str | os.PathLike, *, int8: bool = False, overwrite: bool = False
) -> OnnxExported:
    """Write the posswap (or stock) model at ``name_or_path`` to the new folder ``out`` as ONNX; ``int8`` adds a
    dynamically quantised copy; ``overwrite`` replaces a model folder at ``out`` written earlier (never the source).
    ValueError, before anything is written, for a method with no graph form."""
    require_onnx()
    from ..loading import resolve_model_id
    from .graph import native_model, onnx_refusal, write_graph  # imports onnx: after require_onnx

    source = resolve_model_id(name_or_path)
    out = check_folder_target(out, overwrite, source)
    check_model_files(source)
    st, model, tokenizer = _load(source)
    reason = onnx_refusal(model)
    if reason is not None:
        raise ValueError(f"No ONNX export for {name_or_path}: {reason}.")
    if tokenizer is None:
        raise ValueError(
            f"No ONNX export for {name_or_path}: the folder has no tokenizer, which the graph's inputs follow."
        )
    native = native_model(model)
    result = OnnxExported(out, [], 0.0, "sentence-transformers" if st is not None else "transformers")

    def write(staging: Path) -> None:
        graph = staging / ("onnx/model.onnx" if st is not None else "model.onnx")
        if st is not None:
            _save_sentence_files(st, staging)
        else:
            tokenizer.save_pretrained(staging)
        _write_config(native, model, staging / "config.json", graph.relative_to(staging))
        names = write_graph(model, native, tokenizer, graph)
        result.max_difference = check_graph(model, graph, names)
        result.graphs.append(str(graph.relative_to(staging)))
        if int8:
            from .quantize import quantize_int8

            quantized = quantize_int8(graph, graph.with_name("model_qint8.onnx"))
            result.int8_cosine = int8_agreement(model, graph, quantized, names)
            result.graphs.append(str(quantized.relative_to(staging)))

    write_folder(out, write, overwrite, source)
    return result


def _load(name_or_path: str):
    from ..loading import load_model_and_tokenizer, load_sentence_transformer
    from ..sentence_models import transformer_module

    st = load_sentence_transformer(name_or_path, device="cpu")
    if st is not None:
        return st, transformer_module(st).auto_model.eval(), st.tokenizer
    model, tokenizer = load_model_and_tokenizer(name_or_path)
    return None, model.eval(), tokenizer


def _save_sentence_files(st: nn.Module, staging: Path) -> None:
    """Everything sentence-transformers' save writes but the torch weights and posswap's code and card."""
    st.save(str(staging))
    for path in staging.iterdir():
        if path.name in POSSWAP_FILES or (path.name.startswith("posswap_") and path.suffix == ".py"):
            path.unlink()


def _write_config(native: nn.Module, model: nn.Module, path: Path, graph: Path) -> None:
    native.config.save_pretrained(path.parent)
    config = json.loads(path.read_text())
    config[EXPORT_KEY] = {"graph": str(graph), "patched": getattr(model.config, CONFIG_KEY, None)}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def probe_batches(model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(ids, mask) pairs: short and longer single rows, and a padded batch of a short row beside a long one. With
    ``exact_short_inputs`` the lengths straddle the original length, where the rule in the graph switches (and with
    ``stride_per_length`` half the table, past which a row steps by one)."""
    c = model.config
    block = getattr(c, CONFIG_KEY, None) or {}
    longest = c.max_position_embeddings
    edge = block.get("original_length", 64) if block.get("exact_short_inputs") else 64
    halfway = [longest // 2 + 8] if block.get("stride_per_length") else []
    lengths = sorted({min(n, longest) for n in (8, edge, edge + 8, *halfway)})
    generator = torch.Generator().manual_seed(0)
    ids = lambda n: torch.randint(1000, c.vocab_size, (1, n), generator=generator)  # noqa: E731  (no special ids)
    batches = [(row, torch.ones_like(row)) for row in map(ids, lengths)]
    padded = ids(lengths[-1]).repeat(2, 1)
    mask = torch.ones_like(padded)
    mask[1, lengths[0] :] = 0
    padded[1, lengths[0] :] = c.pad_token_id or 0
    return batches + [(padded, mask)]


def run_graph(session, names: list[str], ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    return session.run(None, {name: feed[name].numpy() for name in names})[0]


def session(graph: Path):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # as many as the torch model had
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])


@torch.no_grad()
def check_graph(model: nn.Module, graph: Path, names: list[str]) -> float:
    """Max |difference| between the graph's outputs (onnxruntime) and the torch model's, over real tokens."""
    graph_session, worst = session(graph), 0.0
    for ids, mask in probe_batches(model):
        extra = {"token_type_ids": torch.zeros_like(ids)} if "token_type_ids" in names else {}
        expected = model(input_ids=ids, attention_mask=mask, **extra)[0]
        got = torch.from_numpy(run_graph(graph_session, names, ids, mask))
        worst = max(worst, float((got - expected).abs()[mask.bool()].max()))
    if not worst <= TOLERANCE:  # also catches NaN
        raise ValueError(
            f"The ONNX graph differs from the torch model by {worst:.2e} (limit {TOLERANCE:.0e}), so nothing was written."
        )
    return worst


def int8_agreement(model: nn.Module, graph: Path, quantized: Path, names: list[str]) -> dict[int, float]:
    """Per probe length, the mean cosine of the int8 graph's token outputs to the float graph's."""
    float_session, int8_session, cosines = session(graph), session(quantized), {}
    for ids, mask in probe_batches(model)[:-1]:
        a, b = run_graph(float_session, names, ids, mask)[0], run_graph(int8_session, names, ids, mask)[0]
        cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        cosines[ids.shape[1]] = round(float(cos.mean()), 5)
    return cosines
