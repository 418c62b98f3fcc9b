"""A text cut into pieces a model reads whole, at paragraph or sentence ends: what a user with a vector database
indexes. The pieces, joined, are the text (each keeps the whitespace after it), so their character spans are the
text's own and :func:`posswap.late_chunks` can pool each one inside the whole document.

A piece holds at most ``max_tokens`` tokens, the tokenizer's special tokens counted (as ``max_seq_length`` counts
them): read alone it is not truncated. The cut is the last paragraph end within the budget when that keeps at least
half of it, else the last sentence end, else the last word end (a sentence longer than the budget), else a token
end.
"""

from __future__ import annotations

import re
from bisect import bisect_right

PARAGRAPH_END = re.compile(r"\n\s*\n\s*")
SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s+")
WORD_END = re.compile(r"\s+")


def split_text(tokenizer, text: str, max_tokens: int = 256) -> list[str]:
    """``text`` as pieces of at most ``max_tokens`` tokens each (special tokens counted), cut at paragraph, then
    sentence, then word ends; ``"".join(pieces) == text``. ``tokenizer``: a transformers tokenizer or a model with
    one (a ``SentenceTransformer``)."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    budget = _check_split(tokenizer, text, max_tokens)
    if not text:
        return [text]
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)["offset_mapping"]
    starts = [start for start, _ in offsets]
    cuts = {name: [m.end() for m in pattern.finditer(text)] for name, pattern in _PATTERNS}
    pieces, begin = [], 0
    while bisect_right(starts, begin - 1) + budget < len(starts):  # more tokens left than one piece holds
        first = bisect_right(starts, begin - 1)  # the index of the piece's first token
        limit = starts[first + budget]  # a cut at or before this character keeps the piece within budget
        end = _best_cut(cuts, begin, limit, starts[first + budget // 2])
        pieces.append(text[begin:end])
        begin = end
    pieces.append(text[begin:])
    return pieces


_PATTERNS = (("paragraph", PARAGRAPH_END), ("sentence", SENTENCE_END), ("word", WORD_END))


def _best_cut(cuts: dict[str, list[int]], begin: int, limit: int, half: int) -> int:
    """The cut after ``begin`` and at or before ``limit``: a paragraph end past ``half``, else a sentence end,
    else a word end, else ``limit`` itself (a token boundary)."""
    for name, floor in (("paragraph", half), ("sentence", begin + 1), ("word", begin + 1)):
        ends = cuts[name]
        at = bisect_right(ends, limit) - 1
        if at >= 0 and ends[at] >= floor and ends[at] > begin:
            return ends[at]
    return limit


def _check_split(tokenizer, text: str, max_tokens: int) -> int:
    """The text tokens a piece may hold, after one-line checks."""
    if not isinstance(text, str):
        raise ValueError(f"text must be a string; got {type(text).__name__}.")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive whole number of tokens; got {max_tokens!r}.")
    if not callable(tokenizer) or not getattr(tokenizer, "is_fast", False):
        raise ValueError(
            "tokenizer must be a fast transformers tokenizer (character offsets) or a model with one; "
            f"got {type(tokenizer).__name__}."
        )
    budget = max_tokens - tokenizer.num_special_tokens_to_add(pair=False)
    if budget < 1:
        raise ValueError(f"max_tokens must leave room for text beside the special tokens; got {max_tokens}.")
    return budget
