"""The embedded corpus as ``datasets`` splits, and ``load_text_dataset`` for any ``--data`` value.

Every split is a ``datasets.Dataset`` with one row per document (columns ``name`` and ``text``):
documents are whole novels, and the evaluation harness tokenises them as one stream and cuts windows.
"""

from __future__ import annotations

from pathlib import Path

import datasets

from . import read_document

# Held out of every training split: evaluation text no recipe has trained on.
HELDOUT_DOCUMENTS = ("persuasion",)
# A second held-out domain, unlike every training text: technical prose (the Python tutorial and HOWTOs).
TECHNICAL_DOCUMENTS = ("python-docs",)
AUSTEN_TRAIN_DOCUMENTS = ("emma", "mansfieldpark", "northangerabbey", "prideprejudice", "sensesensibility")

SPLITS: dict[str, tuple[str, ...]] = {
    "austen-train": AUSTEN_TRAIN_DOCUMENTS,
    "train": AUSTEN_TRAIN_DOCUMENTS + ("kjv",),
    "austen-heldout": HELDOUT_DOCUMENTS,
    "technical-heldout": TECHNICAL_DOCUMENTS,
    "kjv": ("kjv",),
}
EMBEDDED_PREFIX = "posswap:"
_LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
LOCAL_SUFFIXES = tuple(_LOCAL_BUILDERS)  # what a local --data / data.train file may end with


def load_split(split: str) -> datasets.Dataset:
    """One named split of the embedded corpus (``austen-train``, ``train``, ``austen-heldout``, ``technical-heldout``, ``kjv``)."""
    if split not in SPLITS:
        raise ValueError(
            f"No embedded split {split!r}. Use one of: {', '.join(EMBEDDED_PREFIX + s for s in SPLITS)}."
        )
    names = SPLITS[split]
    return datasets.Dataset.from_dict({"name": list(names), "text": [read_document(n) for n in names]})


def load_text_dataset(
    spec: str, text_column: str = "text", streaming: bool = False, default_split: str = "test"
) -> datasets.Dataset | datasets.IterableDataset:
    """A dataset with a ``text`` column from ``spec``:

    - ``posswap:<split>``: the embedded corpus (see :data:`SPLITS`);
    - a local ``.txt`` (one document per file), ``.jsonl`` / ``.json`` or ``.parquet`` file;
    - a ``datasets`` Hub name, ``NAME[:CONFIG][@SPLIT]`` (split ``default_split`` unless given), e.g.
      ``wikitext:wikitext-2-raw-v1@test``. Remote code is never run.

    ``streaming`` gives an ``IterableDataset`` read as it is consumed (corpora larger than memory).
    """
    if spec.startswith(EMBEDDED_PREFIX):
        split = load_split(spec[len(EMBEDDED_PREFIX):])
        return split.to_iterable_dataset() if streaming else split
    path = Path(spec)
    if path.exists():
        builder = _LOCAL_BUILDERS.get(path.suffix)
        if builder is None:
            raise ValueError(f"Cannot read {spec!r}: use a .txt, .jsonl, .json or .parquet file.")
        options = {"sample_by": "document"} if builder == "text" else {}
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train", streaming=streaming, **options)
    else:
        name, _, split = spec.partition("@")
        name, _, config = name.partition(":")
        dataset = datasets.load_dataset(name, config or None, split=split or default_split, streaming=streaming)
    # A streamed dataset may not know its columns before it is read (column_names is None then).
    if dataset.column_names is not None and text_column not in dataset.column_names:
        raise ValueError(
            f"{spec!r} has no {text_column!r} column (columns: {', '.join(dataset.column_names)}); "
            "give a dataset with a text column."
        )
    return dataset
