"""Self-supervised pairs for long embeddings: a document of a given token length cut from the training text, and a
passage drawn uniformly from inside it. With in-batch negatives (MultipleNegativesRankingLoss) the model must find
the one document, among the batch's, that holds the passage: wherever in the document the passage lies, so it
must read the whole of it. A hard negative (optional) is the same document with the passage's words replaced by
as many words from elsewhere in the text: it differs from the document only there, as the documents of a passkey
search differ only in their needle. Seeded; built with ``datasets``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from ...data.splits import load_text_dataset


def document_pairs(
    spec: str,
    tokenizer: Any,
    lengths: list[int],
    pairs: int,
    anchor_words: int,
    seed: int,
    text_column: str = "text",
    hard_negatives: bool = False,
) -> datasets.Dataset:
    """``pairs`` rows of ``anchor`` (``anchor_words`` consecutive words of the document) and ``positive`` (the
    document), the columns sentence-transformers' losses read in order.
    Pair i's document is ``lengths[i % len(lengths)]`` tokens long with [CLS] and [SEP], so it fits that length
    whole. Sources are drawn in proportion to their tokens; positions uniformly. ``hard_negatives``: a
    ``negative`` column too, the document with the anchor's words replaced by ``anchor_words`` words drawn
    elsewhere (a few tokens longer or shorter than the document, within the model's reading limit after
    truncation)."""
    texts, offsets = tokenized_sources(spec, tokenizer, text_column)
    special = tokenizer.num_special_tokens_to_add(pair=False)
    sizes = np.array([len(o) for o in offsets], dtype=float)
    longest = max(lengths) - special
    if sizes.max(initial=0) < longest:
        raise ValueError(
            f"data.train {spec!r} has no document of {longest} tokens (its longest: {int(sizes.max(initial=0))}); "
            "use more text or shorter embedding.document_lengths."
        )
    rng = np.random.default_rng(seed)
    rows = {"anchor": [], "positive": []} | ({"negative": []} if hard_negatives else {})
    for index in range(pairs):
        tokens = lengths[index % len(lengths)] - special
        fits = np.where(sizes >= tokens, sizes - tokens + 1, 0)  # starting places in each source
        source = int(rng.choice(len(texts), p=fits / fits.sum()))
        start = int(rng.integers(0, fits[source]))
        spans = offsets[source]
        document = " ".join(texts[source][spans[start][0] : spans[start + tokens - 1][1]].split())
        words = document.split(" ")
        first = int(rng.integers(0, max(len(words) - anchor_words, 0) + 1))
        rows["anchor"].append(" ".join(words[first : first + anchor_words]))
        if hard_negatives:
            swapped = replacement_words(texts, rng, anchor_words, rows["anchor"][-1])
            rows["negative"].append(" ".join(words[:first] + swapped + words[first + anchor_words :]))
        rows["positive"].append(document)
    return datasets.Dataset.from_dict(rows)


# The last sources tokenised: a recipe cuts its pairs and its teacher's texts from the same text with the same
# tokenizer, once per run of a soup (3 s a time for the Austen split).
_TOKENIZED: dict[tuple, tuple[list[str], list[np.ndarray]]] = {}


def tokenized_sources(spec: str, tokenizer: Any, text_column: str) -> tuple[list[str], list[np.ndarray]]:
    """The non-empty texts of ``spec`` and, per text, its tokens' (start, end) character offsets: they map tokens
    back to characters, so a document is an exact slice of its source text. Kept for the next call with the same
    data and an identical tokenizer (a slow tokenizer is not kept)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    key = (spec, source_stamp(spec), text_column, tokenizer_fingerprint(backend)) if backend else None
    if key is not None and key in _TOKENIZED:
        return _TOKENIZED[key]
    raw = load_text_dataset(spec, text_column=text_column, default_split="train")
    texts = [text for text in raw[text_column] if isinstance(text, str) and text.strip()]
    offsets = [
        np.array(
            tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        )
        for text in texts
    ]
    if key is not None:
        _TOKENIZED.clear()
        _TOKENIZED[key] = texts, offsets
    return texts, offsets


def source_stamp(spec: str) -> tuple:
    """Size and time of change of a local data file (or of each file of a folder): an edited file is read again."""
    path = Path(spec)
    if not path.exists():
        return ()  # an embedded split or a Hub dataset: fixed for the process
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.is_file())


def tokenizer_fingerprint(backend: Any) -> str:
    """A hash of a fast tokenizer's serialised state, less the truncation and padding that each call sets."""
    state = json.loads(backend.to_str())
    state.pop("truncation", None), state.pop("padding", None)
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


def replacement_words(texts: list[str], rng: np.random.Generator, count: int, anchor: str) -> list[str]:
    """``count`` consecutive words from a random place in ``texts`` (a source drawn by its length), not the
    anchor's own words."""
    sizes = np.array([len(text) for text in texts], dtype=float)
    for _ in range(100):
        words = texts[int(rng.choice(len(texts), p=sizes / sizes.sum()))].split()
        first = int(rng.integers(0, max(len(words) - count, 0) + 1))
        swapped = words[first : first + count]
        if len(swapped) == count and " ".join(swapped) != anchor:
            return swapped
    raise ValueError(f"data.train has no run of {count} words to make a hard negative from; lower anchor_words.")
