"""Run an exported sentence-transformers folder (``posswap export --format onnx``) with onnxruntime alone: the
folder's tokenizer (``tokenizers``), its ``onnx/`` graph, and its pooling and normalisation read from the folder's
module configs. No torch, no transformers, no code of posswap's in the computation: the graph holds it.

This is the stand-in for ``SentenceTransformer(folder, backend="onnx")`` while sentence-transformers' ONNX route
(optimum-onnx) cannot be installed beside transformers 5 (docs/onnx.md says why); the folder is already in the
layout that route reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

POOLING = ("mean", "cls")
OLD_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}  # sentence-transformers < 6
# Tables with pad_token_id + 1 rows before the first position: Architecture.offset, kept here as names because this
# module runs without torch (tests/test_families.py checks the two agree).
PADDING_OFFSET_TYPES = ("roberta", "xlm-roberta", "camembert", "mpnet")


class OnnxEncoder:
    """``OnnxEncoder(folder).encode(texts)``: one embedding a text, as ``SentenceTransformer.encode`` gives them."""

    def __init__(self, folder: str | os.PathLike, file_name: str = "onnx/model.onnx", threads: int | None = None):
        import onnxruntime
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        if not (self.folder / file_name).is_file():
            raise ValueError(
                f"{self.folder}: no ONNX graph at {file_name} (a torch folder?): run `posswap export {self.folder} "
                "--format onnx --out OUT` first and open OUT."
            )
        options = onnxruntime.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads yield the cores
        self.session = onnxruntime.InferenceSession(
            str(self.folder / file_name), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = [i.name for i in self.session.get_inputs()]
        settings = json.loads((self.folder / "sentence_bert_config.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        tokenizer_config = json.loads((self.folder / "tokenizer_config.json").read_text())
        self.tokenizer.enable_truncation(settings.get("max_seq_length") or tokenizer_config["model_max_length"])
        config = json.loads((self.folder / "config.json").read_text())
        pad = config.get("pad_token_id") or 0
        self.tokenizer.enable_padding(pad_id=pad, pad_token=self.tokenizer.id_to_token(pad))
        self.model_type, self.max_length = config.get("model_type"), _max_length(config)
        self.lower = bool(settings.get("do_lower_case"))
        self.pooling, self.normalize = _modules(self.folder)

    def features(self, texts: list[str], first: int = 0) -> dict[str, np.ndarray]:
        """The graph's inputs for ``texts`` (``first``: the index of ``texts[0]`` among the caller's, for errors)."""
        encodings = self.tokenizer.encode_batch([t.lower() if self.lower else t for t in texts])
        self._check_lengths(encodings, first)
        arrays = {
            "input_ids": [e.ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
        }
        return {name: np.asarray(arrays[name], dtype=np.int64) for name in self.inputs}

    def _check_lengths(self, encodings: list, first: int) -> None:
        """A text longer than the model reads (``max_seq_length`` raised past it) is refused before the graph runs."""
        for index, encoding in enumerate(encodings, start=first):
            length = sum(encoding.attention_mask)  # its own tokens, not the batch's padding
            if self.max_length is not None and length > self.max_length:
                raise ValueError(
                    f"{self.folder}: text {index} needs {length} positions but this {self.model_type} model "
                    f"reads at most {self.max_length} tokens: set max_seq_length in sentence_bert_config.json to "
                    f"{self.max_length} or less (longer texts are then truncated)."
                )

    def encode(self, texts: list[str] | str, batch_size: int = 8) -> np.ndarray:
        """(texts, dim) float32 embeddings; a single string gives (dim,)."""
        single = isinstance(texts, str)
        texts = [texts] if single else list(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str):
                kind = "None" if text is None else type(text).__name__
                raise ValueError(
                    f"text {index} is {kind}, not a string: OnnxEncoder.encode takes a string or a list of strings."
                )
        parts = []
        for start in range(0, len(texts), batch_size):
            feed = self.features(texts[start : start + batch_size], start)
            tokens = self.session.run(None, feed)[0]
            parts.append(self.pool(tokens, feed["attention_mask"]))
        out = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
        return out[0] if single else out

    def pool(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        if self.pooling == "cls":
            pooled = tokens[:, 0]
        else:
            weights = mask[..., None].astype(tokens.dtype)
            pooled = (tokens * weights).sum(1) / np.clip(weights.sum(1), 1e-9, None)
        if self.normalize:
            pooled = pooled / np.clip(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12, None)
        return pooled.astype(np.float32)


def _max_length(config: dict) -> int | None:
    """Tokens the exported model reads: its table's rows less RoBERTa's padding rows; None when config.json does not
    say."""
    rows = config.get("max_position_embeddings")
    if not isinstance(rows, int):
        return None
    offset = (config.get("pad_token_id") or 0) + 1 if config.get("model_type") in PADDING_OFFSET_TYPES else 0
    return rows - offset


def _modules(folder: Path) -> tuple[str, bool]:
    """The pooling mode and whether embeddings are normalised, from modules.json; other modules are refused."""
    pooling, normalize = None, False
    for module in json.loads((folder / "modules.json").read_text()):
        kind = module["type"].rsplit(".", 1)[-1]
        if kind == "Pooling":
            config = json.loads((folder / module["path"] / "config.json").read_text())
            pooling = config.get("pooling_mode") or next(
                (m for k, m in OLD_POOLING_KEYS.items() if config.get(k)), None
            )
        elif kind == "Normalize":
            normalize = True
        elif kind != "Transformer":
            raise ValueError(
                f"{folder}: module {module['type']} is not one OnnxEncoder runs (Transformer, Pooling, Normalize)"
            )
    if pooling not in POOLING:
        raise ValueError(f"{folder}: pooling {pooling!r} is not one OnnxEncoder runs ({', '.join(POOLING)})")
    return pooling, normalize
