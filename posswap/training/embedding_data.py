"""Self-supervised pairs for long embeddings: a document of a given token length cut from the training text, and a
passage drawn uniformly from inside it. With in-batch negatives (MultipleNegativesRankingLoss) the model must find
the one document, among the batch's, that holds the passage: wherever in the document the passage lies, so it
must read the whole of it. Seeded; built with ``datasets``."""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np

from ..data.splits import load_text_dataset


def document_pairs(
    spec: str,
    tokenizer: Any,
    lengths: list[int],
    pairs: int,
    anchor_words: int,
    seed: int,
    text_column: str = "text",
) -> datasets.Dataset:
    """``pairs`` rows of ``anchor`` (``anchor_words`` consecutive words of the document), ``positive`` (the
    document) and, to check where each came from, ``source`` (row of ``spec``) and ``start`` (its first token).
    Pair i's document is ``lengths[i % len(lengths)]`` tokens long with [CLS] and [SEP], so it fits that length
    whole. Sources are drawn in proportion to their tokens; positions uniformly."""
    raw = load_text_dataset(spec, text_column=text_column, default_split="train")
    texts = [text for text in raw[text_column] if isinstance(text, str) and text.strip()]
    # Offsets map tokens back to characters: a document is an exact slice of its source text.
    offsets = [
        tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
        for text in texts
    ]
    special = tokenizer.num_special_tokens_to_add(pair=False)
    sizes = np.array([len(o) for o in offsets], dtype=float)
    longest = max(lengths) - special
    if sizes.max(initial=0) < longest:
        raise ValueError(
            f"data.train {spec!r} has no document of {longest} tokens (its longest: {int(sizes.max(initial=0))}); "
            "use more text or shorter embedding.document_lengths."
        )
    rng = np.random.default_rng(seed)
    rows = {"anchor": [], "positive": [], "source": [], "start": []}
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
        rows["positive"].append(document)
        rows["source"].append(source)
        rows["start"].append(start)
    return datasets.Dataset.from_dict(rows)
