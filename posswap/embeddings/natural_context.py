"""The natural-reference task: the same real passage under the same names differently assigned, so that only
context decides.

A document is a natural stretch of a novel (no inserted sentence), cut into chunks at sentence ends within
``chunk_tokens`` as the context task cuts its haystacks (:mod:`.context_task`). Its K most-mentioned people (K =
``copies``; the main character, the most mentioned, first) get K invented given names, and copy c calls person i
``names[(i + c) % K]``: a rotation, so every copy holds the same set of names and each person's name differs from
copy to copy. A fact chunk is one that names nobody at all (pronouns and descriptions only): it is word for word the
same in every copy. The query is the main character's name in the copy and a sentence of the fact chunk ("Wren: She
had been forced into prudence in her youth..."): every copy's document holds every copy's query name, so neither a
chunk read alone nor one that only picks up which names its document holds tells the copies apart (both at chance,
one in K); only knowing whom the chunk is about (the main character, through pronouns and context) does. The other
chunks of the document are in-sequence negatives (ConTEB / InSeNT, arXiv 2505.24782). Of a passage's fact chunks,
those about the main character by a simple rule (the nearest person the original passage names before the chunk is
the main character) are asked first, then those farthest from a mention of the main character (each query keeps
that distance, in chunks).

The result is a :class:`~.context_task.ContextTask`: the context task's scorer reads it unchanged, a question's
``relation`` naming its passage and chunk, so "the chunks that answer the same question" are the copies' fact
chunks. The evaluation reads held-out *Persuasion* and names people from the context task's first names; training
(:mod:`.training.context`) reads the recipe's Austen novels and names made of syllables. Seeded with strings.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from dataclasses import dataclass

from ..data.splits import HELDOUT_DOCUMENTS
from .context_task import FIRST, ContextQuery, ContextTask, _sentences
from .retrieval_tasks import special_tokens

COPIES = 4  # copies of each passage in the evaluation: fact accuracy's chance is one in this
FACTS = 2  # fact chunks asked of a passage where it has that many
ATTEMPTS = 200  # passage starts tried before a length is refused as holding no fact chunk
TITLES = "Mr Mrs Miss Sir Lady Lord Captain Colonel Admiral Dr Master".split()
SPEECH = "said cried replied answered exclaimed continued added returned asked".split()
WORD = re.compile(r"[A-Za-z]+")
CAPITAL = re.compile(r"\b[A-Z][a-z]+\b")
MID_SENTENCE = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+\b")  # capitalised where a sentence does not start
AFTER_TITLE = re.compile(rf"\b(?:{'|'.join(TITLES)})\.? ([A-Z][a-z]+)\b")
BESIDE_SPEECH = re.compile(rf"\b(?:{'|'.join(SPEECH)}) ([A-Z][a-z]+)\b|\b([A-Z][a-z]+),? (?:{'|'.join(SPEECH)})\b")


@dataclass(frozen=True)
class NaturalSource:
    """Where documents come from and what a copy's main character is renamed to."""

    haystacks: tuple[str, ...]  # embedded documents (novels), in turn
    names: tuple[str, ...]  # one-word invented given names


EVALUATION_SOURCE = NaturalSource(HELDOUT_DOCUMENTS, tuple(FIRST))


@dataclass(frozen=True)
class Novel:
    paragraphs: list[list[str]]
    names: frozenset[str]  # proper nouns: capitalised mid-sentence or after a title, (almost) never lowercase
    people: frozenset[str]  # of those, the ones a speech verb or a title stands next to
    vocabulary: frozenset[str]  # every word, lowercase: an invented name must be none of them


@dataclass(frozen=True)
class Passage:
    pieces: list[list[str]]  # per copy, its chunks (joined: the document)
    names: list[str]  # per copy, the main character's name in it (the query's)
    original: str  # the name the novel gives the main character
    mentions: list[int]  # chunks that name the main character
    facts: list[tuple[int, int, str]]  # (fact chunk, chunks to the nearest mention, the query's sentence)
    cast: list[str]  # the names the novel gives the people renamed, the main character first
    invented: list[str]  # their invented names: in copy c, cast[i] is invented[(i + c) % len(cast)]
    about_main: list[bool]  # per fact, whether the nearest person named before it is the main character


@functools.lru_cache(maxsize=8)
def read_novel(haystack: str) -> Novel:
    """A novel's paragraphs and its names, by a fixed rule: a word capitalised mid-sentence (or after a title) at
    least twice and lowercase at most once in twenty times is a name; a name beside a speech verb or after a title
    three times is a person's (titles themselves are names, never people)."""
    paragraphs = _sentences(haystack)
    text = "\n".join(" ".join(p) for p in paragraphs)
    lower = Counter(w for w in WORD.findall(text) if w.islower())
    capital = Counter(MID_SENTENCE.findall(text)) + Counter(AFTER_TITLE.findall(text))
    names = {w for w, n in capital.items() if n >= 2 and 20 * lower[w.lower()] <= n}
    near = Counter(a or b for a, b in BESIDE_SPEECH.findall(text)) + Counter(AFTER_TITLE.findall(text))
    people = {w for w in names - set(TITLES) if near[w] >= 3}
    vocabulary = {w.lower() for w in WORD.findall(text)}
    return Novel(paragraphs, frozenset(names), frozenset(people), frozenset(vocabulary))


def build_natural_task(
    tokenizer,
    length: int,
    documents: int,
    seed: int,
    chunk_tokens: int = 128,
    source: NaturalSource = EVALUATION_SOURCE,
    copies: int = COPIES,
    facts: int = FACTS,
    least: int | None = None,
) -> ContextTask:
    """``documents // copies`` passages of at most ``length`` tokens (special tokens counted), each in as many
    copies (consecutive documents) as it has people cast: ``copies``, or no fewer than ``least`` (default
    ``copies``: the scorer counts ``copies`` a passage), in chunks of at most ``chunk_tokens``; per copy a query per
    fact chunk, naming the main character by its name in that copy."""
    rng = random.Random(f"posswap-natural-context-{length}-{chunk_tokens}-{copies}-{seed}-{'-'.join(source.haystacks)}")
    special = special_tokens(tokenizer)
    budget = chunk_tokens - special
    count = (length - special) // budget
    chunks, subjects, naming, queries = [], [], [], []
    for p in range(documents // copies):
        novel = read_novel(source.haystacks[p % len(source.haystacks)])
        passage = _passage(tokenizer, rng, novel, count, budget, source.names, copies, facts, least or copies)
        for name, pieces in zip(passage.names, passage.pieces):
            for chunk, distance, sentence in passage.facts:
                relation = f"passage {p} chunk {chunk}"  # the question every copy of the passage is asked
                queries.append(ContextQuery(f"{name}: {sentence}", len(chunks), chunk, relation, "natural", distance))
            chunks.append(pieces)
            subjects.append(name)
            naming.append(passage.mentions[0])
    return ContextTask(length, chunk_tokens, chunks, subjects, naming, queries)


def _passage(
    tokenizer, rng, novel: Novel, count: int, budget: int, names, copies: int, facts: int, least: int = 2
) -> Passage:
    """A passage from a random paragraph on with at least ``least`` people (at most ``copies`` of them cast, the
    most mentioned) and at least one chunk that names nobody: as many copies as people cast, the cast's invented
    names rotated among them from copy to copy (:func:`_rotated`)."""
    allowed = [n for n in names if n.lower() not in novel.vocabulary]
    for _ in range(ATTEMPTS):
        start = rng.randrange(len(novel.paragraphs))
        plain = _pack(tokenizer, novel.paragraphs, start, count, budget, lambda s: [s])
        cast = _cast(plain, novel.people, copies) if plain else []
        if len(cast) < max(2, least) or not any(_names_nobody(chunk, novel) for chunk in plain):  # cheap first
            continue
        chosen = rng.sample(allowed, len(cast))
        rename = _rotated(cast, chosen)
        renamed = lambda s, rename=rename: [r(s) for r in rename]  # noqa: E731
        body = _pack(tokenizer, novel.paragraphs, start, count, budget, renamed)  # each copy's chunks in budget
        mention = re.compile(rf"\b{cast[0]}\b")
        mentions = [c for c, chunk in enumerate(body or []) if any(mention.search(s) for s, _ in chunk)]
        nameless = [c for c, chunk in enumerate(body or []) if mentions and _names_nobody(chunk, novel)]
        if not nameless:
            continue
        distance = {c: min(abs(c - m) for m in mentions) for c in nameless}
        about = _about(body, novel.people)
        picked = _far_first(rng, nameless, distance, facts, preferred={c for c in nameless if about[c] == cast[0]})
        pieces = [_joined([[(r(s), e) for s, e in chunk] for chunk in body]) for r in rename]
        asked = [(c, distance[c], _sentence_of(rng, body[c])) for c in picked]
        main_names = [chosen[c % len(cast)] for c in range(len(cast))]
        return Passage(
            pieces, main_names, cast[0], mentions, asked, cast, chosen, [about[c] == cast[0] for c in picked]
        )
    raise ValueError(
        f"no passage of {count} chunks names {max(2, least)} people and holds a chunk that names nobody; try shorter."
    )


def _cast(chunks: list[list[tuple]], people: frozenset[str], most: int) -> list[str]:
    """The ``most`` persons' names the passage mentions most (ties: alphabetically first), the main character first."""
    counts = Counter(w for chunk in chunks for s, _ in chunk for w in CAPITAL.findall(s) if w in people)
    return sorted(counts, key=lambda w: (-counts[w], w))[:most]


def _rotated(cast: list[str], invented: list[str]) -> list:
    """Per copy c, a sentence -> its text with character i named ``invented[(i + c) % K]`` (all at once): every copy
    holds every invented name, each character's name differs from copy to copy."""
    k = len(cast)
    pattern = re.compile(rf"\b(?:{'|'.join(cast)})\b")
    maps = [{w: invented[(i + c) % k] for i, w in enumerate(cast)} for c in range(k)]
    return [lambda s, m=m: pattern.sub(lambda found: m[found.group(0)], s) for m in maps]


def _about(chunks: list[list[tuple]], people: frozenset[str]) -> list[str | None]:
    """Per chunk, whom it is taken to be about: the last person the original passage names before the chunk
    ends (the nearest preceding named person; None before any)."""
    last, found = None, []
    for chunk in chunks:
        for s, _ in chunk:
            named = [w for w in CAPITAL.findall(s) if w in people]
            last = named[-1] if named else last
        found.append(last)
    return found


def _pack(tokenizer, paragraphs, start: int, count: int, budget: int, variants) -> list[list[tuple]] | None:
    """``count`` chunks of (sentence, ends its paragraph) from paragraph ``start`` on, each within ``budget`` tokens
    in every variant of its sentences (``variants``: a sentence -> its text in each copy); a sentence longer than
    half a chunk is passed over, as the context task does. None where the novel ends first (it never wraps)."""
    chunks, chunk, used = [], [], 0
    for paragraph in paragraphs[start:]:
        costs = _costs(tokenizer, paragraph, variants)
        for i, (sentence, cost) in enumerate(zip(paragraph, costs)):
            if 2 * cost > budget:
                continue
            if used + cost > budget:
                chunks.append(chunk)
                if len(chunks) == count:
                    return chunks
                chunk, used = [], 0
            chunk.append((sentence, i == len(paragraph) - 1))
            used += cost
    return None


def _costs(tokenizer, sentences: list[str], variants) -> list[int]:
    """Per sentence, the most tokens any of its variants takes."""
    texts = [variants(s) for s in sentences]
    flat = [t for group in texts for t in group]
    counts = iter(len(ids) for ids in tokenizer(flat, add_special_tokens=False, verbose=False)["input_ids"])
    return [max(next(counts) for _ in group) for group in texts]


def _names_nobody(chunk: list[tuple], novel: Novel) -> bool:
    """No name of the novel anywhere in the chunk, and no other word capitalised mid-sentence (a rarer name)."""
    text = " ".join(s for s, _ in chunk)
    return not set(CAPITAL.findall(text)) & novel.names and not MID_SENTENCE.search(text)


def _far_first(rng: random.Random, chunks: list[int], distance: dict, most: int, preferred=frozenset()) -> list[int]:
    """The ``most`` of ``chunks``, ``preferred`` ones first, then farthest from a mention of the name (ties in a
    seeded order), in order."""
    order = rng.sample(chunks, len(chunks))
    return sorted(sorted(order, key=lambda c: (c not in preferred, -distance[c]))[:most])


def _sentence_of(rng: random.Random, chunk: list[tuple]) -> str:
    """A sentence of the chunk for the query: one of 6 to 60 words where there is one, else its longest."""
    sentences = [s for s, _ in chunk]
    fitting = [s for s in sentences if 6 <= len(s.split()) <= 60]
    return rng.choice(fitting) if fitting else max(sentences, key=len)


def _joined(chunks: list[list[tuple]]) -> list[str]:
    """The chunks' texts: sentences joined by a space, by a blank line where a paragraph ends and after a chunk."""
    texts = []
    for chunk in chunks:
        last = len(chunk) - 1
        texts.append("".join(s + ("" if i == last else "\n\n" if ends else " ") for i, (s, ends) in enumerate(chunk)))
    return [t + ("\n\n" if i < len(texts) - 1 else "") for i, t in enumerate(texts)]
