"""Training text -> token windows of one length, through ``datasets`` (map-style, or streaming for corpora
larger than memory). Documents are joined with EOS (or SEP) and cut into full windows, as transformers'
run_clm ``group_texts`` does."""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from ..data.splits import load_text_dataset


def packed_windows(spec: str, tokenizer: Any, length: int, text_column: str = "text", streaming: bool = False):
    """A dataset of ``{"input_ids": [length ints]}`` rows cut from ``spec``'s text."""
    raw = load_text_dataset(spec, text_column=text_column, streaming=streaming, default_split="train")
    separator = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    columns = raw.column_names or [text_column]

    def tokenize(batch: dict[str, list]) -> dict[str, list]:
        ids = tokenizer(batch[text_column], add_special_tokens=False, verbose=False)["input_ids"]
        return {"input_ids": [x + ([separator] if separator is not None else []) for x in ids]}

    def group(batch: dict[str, list]) -> dict[str, list]:
        joined = list(chain.from_iterable(batch["input_ids"]))
        usable = len(joined) // length * length
        return {"input_ids": [joined[i : i + length] for i in range(0, usable, length)]}

    tokenized = raw.map(tokenize, batched=True, remove_columns=columns)
    # Whole documents go to group() together (documents here are novels: batch_size 1000 keeps them joined).
    packed = tokenized.map(group, batched=True, batch_size=1000)
    if not streaming and len(packed) == 0:
        raise ValueError(f"{spec!r} gives no window of {length} tokens; use more text or a shorter length.")
    return packed


def with_repeated_spans(windows, fraction: float, span: int, seed: int):
    """``windows`` where a ``fraction`` of them carry a copy of one of their spans of ``span`` tokens further on,
    written over the text there: the span's start is drawn uniformly, then the copy's start uniformly among the
    places after the span where it fits. Window ``i``'s choices come from its own generator (seed, i), so a
    resumed or streamed run copies the same spans."""
    if fraction == 0:
        return windows

    def copy_span(row: dict, index: int) -> dict:
        rng = np.random.default_rng([seed, index])
        ids = list(row["input_ids"])
        if rng.random() < fraction:
            source = int(rng.integers(0, len(ids) - 2 * span + 1))
            target = int(rng.integers(source + span, len(ids) - span + 1))
            ids[target : target + span] = ids[source : source + span]
        return {"input_ids": ids}

    return windows.map(copy_span, with_indices=True)
