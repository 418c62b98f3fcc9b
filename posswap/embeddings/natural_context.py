"""The natural-reference task: the same real passage with two people's names swapped, so that only knowing whom a
chunk's pronouns refer to decides.

A document is a natural stretch of a novel (no inserted sentence), cut into chunks at sentence ends within
``chunk_tokens`` as the context task cuts its haystacks (:mod:`.context_task`). Two people of the passage, A (she)
and B (he), mentioned about as often (within twice each other's count), get two invented given names X and Y: copy 0
calls A X and B Y, copy 1 calls A Y and B X; every other person keeps their name. Both copies hold the same names,
and since A and B are mentioned about as often, neither the names a document holds nor its most frequent name tells
the copies apart. A fact chunk names nobody and its pronouns are all of one gender (only she/her/hers/herself or only
he/him/his/himself): it is about that gender's person of the pair (and the nearest person of that gender the passage
names before it is that person). It is word for word the same in both copies. Each fact chunk is asked twice, "X:
<a sentence of it>" and "Y: <the same sentence>": for a she-chunk copy 0 answers X (A is X there) and copy 1 answers
Y, so each copy is the answer once per chunk: a rule that reads only which names a document holds is at chance
(one in two). The nearest person named before a fact chunk is the subject for about half of the facts asked and the
other person of the pair for the rest (``template``: ``nearest-subject`` or ``nearest-other``): a chunk that soaks
up its nearest name is near chance too. The subject's gender is held even too: the task's facts about
the pair's she and about its he differ by at most one (a passage gives a she-fact and a he-fact, or one fact that
evens the count; a passage that can do neither is passed over), so the rule "the query names the pair's he" (or
she) is at chance. So is whether the subject is the pair's more mentioned person (facts about the more and about
the less mentioned differ by at most one: a she-fact and a he-fact of one passage even it), so the rule "the query
names the copy's most frequent name" is near chance as well (:func:`_pick`).

The gender of a person (:func:`genders`), a fixed rule: a person whose name follows gendered titles of one gender
only (Mr Sir Captain Admiral Colonel Lord: he; Mrs Miss Lady: she) is that gender; one that follows titles of both
(a family name: Mr and Mrs Croft) has none; an untitled one is the gender of the first pronoun after the name in the
same sentence, counted over the whole novel, where that gender's count is at least three and at least twice the
other's; else none.

The result is a :class:`~.context_task.ContextTask`: the context task's scorer reads it unchanged, a question's
``relation`` naming its passage and chunk, so "the chunks that answer the same question" are the two copies' fact
chunks. The evaluation reads held-out *Persuasion* and names people from the context task's first names; training
(:mod:`.training.context`) reads the recipe's Austen novels and names made of syllables. Seeded with strings.
"""

from __future__ import annotations

import functools
import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass, field

from ..data.splits import HELDOUT_DOCUMENTS
from .context_task import FIRST, ContextQuery, ContextTask, _sentences
from .retrieval_tasks import special_tokens

COPIES = 2  # copies of each passage: fact accuracy's chance is one in this
FACTS = 2  # fact chunks asked of a passage where it has that many (each asked twice, once a name)
ATTEMPTS = 6000  # passage starts tried before a length is refused as holding no fact chunk
LEAD = 2  # the most facts by which nearest-subject may lead nearest-other, or trail it
TITLES = "Mr Mrs Miss Sir Lady Lord Captain Colonel Admiral Dr Master".split()
TITLE_GENDER = {"Mr": "he", "Sir": "he", "Lord": "he", "Captain": "he", "Admiral": "he", "Colonel": "he"} | {
    "Mrs": "she",
    "Miss": "she",
    "Lady": "she",
}
PRONOUNS = {w: "she" for w in ("she", "her", "hers", "herself")} | {w: "he" for w in ("he", "him", "his", "himself")}
SPEECH = "said cried replied answered exclaimed continued added returned asked".split()
WORD = re.compile(r"[A-Za-z]+")
CAPITAL = re.compile(r"\b[A-Z][a-z]+\b")
MID_SENTENCE = re.compile(r"(?<=[a-z,;] )[A-Z][a-z]+\b")  # capitalised where a sentence does not start
AFTER_TITLE = re.compile(rf"\b(?:{'|'.join(TITLES)})\.? ([A-Z][a-z]+)\b")
GENDERED_TITLE = re.compile(rf"\b({'|'.join(TITLE_GENDER)})\.? ([A-Z][a-z]+)\b")
BESIDE_SPEECH = re.compile(rf"\b(?:{'|'.join(SPEECH)}) ([A-Z][a-z]+)\b|\b([A-Z][a-z]+),? (?:{'|'.join(SPEECH)})\b")


@dataclass(frozen=True)
class NaturalSource:
    """Where documents come from and what the pair of a passage is renamed to."""

    haystacks: tuple[str, ...]  # embedded documents (novels), in turn
    names: tuple[str, ...]  # one-word invented given names


EVALUATION_SOURCE = NaturalSource(HELDOUT_DOCUMENTS, tuple(FIRST))


@dataclass(frozen=True)
class Novel:
    paragraphs: list[list[str]]
    names: frozenset[str]  # proper nouns: capitalised mid-sentence or after a title, (almost) never lowercase
    people: frozenset[str]  # of those, the ones a speech verb or a title stands next to
    vocabulary: frozenset[str]  # every word, lowercase: an invented name must be none of them
    genders: dict[str, str]  # person -> "she" or "he" (:func:`genders`); people of no clear gender left out
    plain: dict = field(default_factory=dict, compare=False, repr=False)  # :func:`_plain`'s, by where it starts


@dataclass(frozen=True)
class Fact:
    chunk: int  # the fact chunk (the same in both copies)
    subject: int  # whom its pronouns mean: 0 (the pair's she, A) or 1 (its he, B)
    nearest: str  # "subject" or "other": the pair person the passage names last before the chunk
    distance: int  # chunks to the nearest chunk that names the subject
    sentence: str  # the query's sentence, one of the chunk's


@dataclass(frozen=True)
class Passage:
    pieces: list[list[str]]  # per copy, its chunks (joined: the document)
    cast: list[str]  # the pair's names in the novel: A (she), then B (he)
    invented: list[str]  # X, Y: copy 0 calls A X and B Y, copy 1 calls A Y and B X
    mentions: list[list[int]]  # per pair person, the chunks that name them
    counts: list[int]  # per pair person, their mentions in the passage
    facts: list[Fact]

    def name(self, person: int, copy: int) -> str:
        """What ``copy`` calls cast[``person``]."""
        return self.invented[(person + copy) % COPIES]

    def answer(self, fact: Fact, name: str) -> int:
        """The copy whose subject of ``fact`` is called ``name``."""
        return (self.invented.index(name) - fact.subject) % COPIES


@functools.lru_cache(maxsize=8)
def read_novel(haystack: str) -> Novel:
    """A novel's paragraphs and its names, by a fixed rule: a word capitalised mid-sentence (or after a title) at
    least twice and lowercase at most once in twenty times is a name; a name beside a speech verb or after a title
    three times is a person's (titles themselves are names, never people); the people's genders by :func:`genders`."""
    paragraphs = _sentences(haystack)
    text = "\n".join(" ".join(p) for p in paragraphs)
    lower = Counter(w for w in WORD.findall(text) if w.islower())
    capital = Counter(MID_SENTENCE.findall(text)) + Counter(AFTER_TITLE.findall(text))
    names = {w for w, n in capital.items() if n >= 2 and 20 * lower[w.lower()] <= n}
    near = Counter(a or b for a, b in BESIDE_SPEECH.findall(text)) + Counter(AFTER_TITLE.findall(text))
    people = frozenset(w for w in names - set(TITLES) if near[w] >= 3)
    vocabulary = {w.lower() for w in WORD.findall(text)}
    found = genders([s for p in paragraphs for s in p], people)
    return Novel(paragraphs, frozenset(names), people, frozenset(vocabulary), found)


def genders(sentences: list[str], people) -> dict[str, str]:
    """Person -> "she" or "he", by a fixed rule of two votes counted over ``sentences``. Titles: the gendered titles
    just before the name (Mr Sir Lord Captain Admiral Colonel: he; Mrs Miss Lady: she) vote for a gender holding at
    least four times the other's count. Pronouns: the first of she/her/hers/herself or he/him/his/himself within the
    five words after the name in its sentence vote for a gender holding at least 5 and twice the other's count. A
    person is the gender the votes give, none where they disagree (Mrs Charles Musgrove is Mary, Charles is a he)
    or neither gives one (a family's name: Mr and Miss Elliot); people of none are left out."""
    titled = {p: Counter() for p in people}
    after = {p: Counter() for p in people}
    for sentence in sentences:
        for title, name in GENDERED_TITLE.findall(sentence):
            if name in titled:
                titled[name][TITLE_GENDER[title]] += 1
        words = WORD.findall(sentence)
        for i, word in enumerate(words):
            if word in after:
                first = next((PRONOUNS[w.lower()] for w in words[i + 1 : i + 6] if w.lower() in PRONOUNS), None)
                if first:
                    after[word][first] += 1
    found = {}
    for person in people:
        if person.endswith("s") and person[:-1] in people:  # the Musgroves: a family
            continue
        title = _dominant(titled[person], 4, 1)
        if min(titled[person]["she"], titled[person]["he"]) >= 3 or title is None and len(+titled[person]) == 2:
            continue
        votes = {title, _dominant(after[person], 2, 5)} - {None}
        if len(votes) == 1:
            found[person] = votes.pop()
    return found


def _dominant(counts: Counter, times: int, least: int) -> str | None:
    """The gender of ``counts`` with at least ``least`` and ``times`` the other's count, if one has."""
    she, he = counts["she"], counts["he"]
    if max(she, he) >= least and max(she, he) >= times * min(she, he):
        return "she" if she > he else "he"
    return None


def build_natural_task(
    tokenizer,
    length: int,
    documents: int,
    seed: int,
    chunk_tokens: int = 128,
    source: NaturalSource = EVALUATION_SOURCE,
    facts: int = FACTS,
) -> ContextTask:
    """``documents // 2`` passages of at most ``length`` tokens (special tokens counted), each in two copies
    (consecutive documents) in chunks of at most ``chunk_tokens``; per fact chunk two queries, one a name of the
    pair, answered by different copies. A query's ``template`` is ``nearest-subject`` or ``nearest-other`` (whom the
    passage names last before the fact chunk); the facts asked are held balanced on that, on the subject's gender and on
    whether the subject is the pair's more mentioned person (:func:`_pick`)."""
    rng = random.Random(f"posswap-natural-context-{length}-{chunk_tokens}-{COPIES}-{seed}-{'-'.join(source.haystacks)}")
    special = special_tokens(tokenizer)
    budget = chunk_tokens - special
    count = (length - special) // budget
    chunks, subjects, naming, queries = [], [], [], []
    lead: Counter = Counter()
    for p in range(documents // COPIES):
        passage = _from_any(tokenizer, rng, source, p, count, budget, facts, lead)
        first = len(chunks)
        for copy, pieces in enumerate(passage.pieces):
            chunks.append(pieces)
            subjects.append(passage.name(0, copy))  # the pair's she in this copy
            naming.append(min(passage.mentions[0]))
        for fact in passage.facts:
            relation = f"passage {p} chunk {fact.chunk}"  # the question both copies answer, one a name
            for name in passage.invented:
                document = first + passage.answer(fact, name)
                template = f"nearest-{fact.nearest}"
                queries.append(
                    ContextQuery(f"{name}: {fact.sentence}", document, fact.chunk, relation, template, fact.distance)
                )
    return ContextTask(length, chunk_tokens, chunks, subjects, naming, queries)


def _from_any(tokenizer, rng, source: NaturalSource, p: int, count: int, budget: int, facts: int, lead: Counter):
    """Passage ``p`` from the source's novels in turn; a novel that holds none (too few gendered pairs at this
    length) passes to the next; the last one's refusal where none holds one."""
    haystacks = source.haystacks
    for k in range(len(haystacks)):
        try:
            novel = read_novel(haystacks[(p + k) % len(haystacks)])
            return _passage(tokenizer, rng, novel, count, budget, source.names, facts, lead)
        except ValueError:
            if k == len(haystacks) - 1:
                raise
    raise AssertionError("unreachable")


def _passage(tokenizer, rng, novel: Novel, count: int, budget: int, names, facts: int, lead: Counter) -> Passage:
    """A passage from a random paragraph on with a pair (:func:`_pairs`) and a fact chunk about one of them
    (:func:`_facts`) that keeps the task's balance (``lead``, updated): two copies, the pair's names swapped."""
    allowed = [n for n in names if n.lower() not in novel.vocabulary]
    for _ in range(ATTEMPTS):
        start = rng.randrange(len(novel.paragraphs))
        plain = _plain(tokenizer, novel, start, count, budget)
        if not plain:
            continue
        for pair in _pairs(plain, novel):
            if not _facts(plain, novel, pair):
                continue
            chosen = rng.sample(allowed, COPIES)
            rename = _rotated(list(pair), chosen)
            renamed = lambda s, rename=rename: [r(s) for r in rename]  # noqa: E731
            body = _pack(tokenizer, novel.paragraphs, start, count, budget, renamed)  # each copy's chunks in budget
            counts = _counts(body or [], novel.people)
            if not body or not _similar(counts[pair[0]], counts[pair[1]]):
                continue
            picked = _pick(rng, _facts(body, novel, pair), counts[pair[0]], counts[pair[1]], facts, lead)
            if not picked:
                continue
            mentions = [[c for c, chunk in enumerate(body) if any(_names(s, who) for s, _ in chunk)] for who in pair]
            asked = [
                Fact(c, subject, nearest, min(abs(c - m) for m in mentions[subject]), _sentence_of(rng, body[c]))
                for c, subject, nearest in picked
            ]
            pieces = [_joined([[(r(s), e) for s, e in chunk] for chunk in body]) for r in rename]
            return Passage(pieces, list(pair), chosen, mentions, [counts[pair[0]], counts[pair[1]]], asked)
    raise ValueError(
        f"no passage of {count} chunks names a she and a he about as often and holds a chunk about one of them that "
        "names nobody; try longer."
    )


def _plain(tokenizer, novel: Novel, start: int, count: int, budget: int) -> list[list[tuple]] | None:
    """The passage from paragraph ``start`` as the novel has it, where one of its chunks could be a fact chunk (it
    names nobody, its pronouns of one gender); else None. Kept on the novel: a task tries thousands of starts, most
    of them many times over."""
    key = (start, count, budget, type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), len(tokenizer))
    if key not in novel.plain:
        plain = _pack(tokenizer, novel.paragraphs, start, count, budget, lambda s: [s])
        novel.plain[key] = plain if plain and any(_gender_of(chunk, novel) for chunk in plain) else None
    return novel.plain[key]


def _names(sentence: str, person: str) -> bool:
    return person in CAPITAL.findall(sentence)


def _counts(chunks: list[list[tuple]], people) -> Counter:
    """Each person's mentions in the passage."""
    return Counter(w for chunk in chunks for s, _ in chunk for w in CAPITAL.findall(s) if w in people)


def _similar(a: int, b: int) -> bool:
    return a >= 1 and b >= 1 and max(a, b) <= 2 * min(a, b)


def _pairs(chunks: list[list[tuple]], novel: Novel) -> list[tuple[str, str]]:
    """(she, he) pairs of people the passage mentions within twice each other's count, the most mentioned first
    (by the fewer of the two mentions, then the more, then alphabetically)."""
    counts = _counts(chunks, novel.people)
    she = [p for p in counts if novel.genders.get(p) == "she"]
    he = [p for p in counts if novel.genders.get(p) == "he"]
    pairs = [(a, b) for a in she for b in he if _similar(counts[a], counts[b])]
    return sorted(pairs, key=lambda p: (-min(counts[p[0]], counts[p[1]]), -max(counts[p[0]], counts[p[1]]), p))


def _gender_of(chunk: list[tuple], novel: Novel) -> str | None:
    """ "she" or "he" for a chunk that names nobody and whose pronouns are all of that gender; else None."""
    if not _names_nobody(chunk, novel):
        return None
    found = {PRONOUNS[w.lower()] for s, _ in chunk for w in WORD.findall(s) if w.lower() in PRONOUNS}
    return next(iter(found)) if len(found) == 1 else None


def _facts(chunks: list[list[tuple]], novel: Novel, pair: tuple[str, str]) -> list[tuple[int, int, str]]:
    """(chunk, subject, nearest) per fact chunk about the pair: it names nobody, its pronouns are of one gender
    only, the person of that gender the passage names last before it is the pair's, and the person it names last
    before it (of any gender) is one of the pair: ``nearest`` says which ("subject" or "other")."""
    found, last, last_of = [], None, {}
    for c, chunk in enumerate(chunks):
        gender = _gender_of(chunk, novel)
        if gender is not None:
            subject = 0 if gender == "she" else 1
            if last_of.get(gender) == pair[subject] and last in pair:
                found.append((c, subject, "subject" if last == pair[subject] else "other"))
        for s, _ in chunk:
            for person in (w for w in CAPITAL.findall(s) if w in novel.people):
                last = person
                if person in novel.genders:
                    last_of[novel.genders[person]] = person
    return found


def _pick(rng: random.Random, found: list, she: int, he: int, most: int, lead: Counter) -> list:
    """At most ``most`` of ``found`` that keep the task balanced: after them the task's she-facts and he-facts
    differ by at most one (``gender``: she - he), so do the facts whose subject the passage mentions more than the
    other person of the pair and those it mentions less (``frequent``), and ``nearest`` (subject - other) stays
    within :data:`LEAD`. Of the sets that do, the largest, then the one that leaves the leads nearest to even, then
    the first in a seeded order. With ``most`` two and even leads that is a she-fact and a he-fact (which also
    evens ``frequent``: one subject is the more mentioned, the other the less). Empty where no set keeps the balance (the passage is passed over). ``lead`` is
    updated."""
    order = rng.sample(found, len(found))
    for size in range(min(most, len(order)), 0, -1):
        fitting = []
        for chosen in itertools.combinations(order, size):
            after = Counter(lead)
            for fact in chosen:
                after = _add(after, _signs(fact, she, he))
            if abs(after["gender"]) <= 1 and abs(after["frequent"]) <= 1 and abs(after["nearest"]) <= LEAD:
                fitting.append((sum(abs(v) for v in after.values()), chosen, after))
        if fitting:
            _, chosen, after = min(fitting, key=lambda f: f[0])  # the first of the seeded order on a tie
            for key, value in after.items():
                lead[key] = value
            return sorted(chosen)
    return []


def _signs(fact: tuple, she: int, he: int) -> Counter:
    _, subject, nearest = fact
    counts = (she, he)
    frequent = (counts[subject] > counts[1 - subject]) - (counts[subject] < counts[1 - subject])
    return Counter({"nearest": 1 if nearest == "subject" else -1, "gender": 1 - 2 * subject, "frequent": frequent})


def _add(a: Counter, b: Counter) -> Counter:
    """Counter addition that keeps zero and negative counts."""
    out = Counter(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def _rotated(cast: list[str], invented: list[str]) -> list:
    """Per copy c, a sentence -> its text with person i named ``invented[(i + c) % K]`` (all at once): every copy
    holds every invented name, each person's name differs from copy to copy (with two, a swap)."""
    k = len(cast)
    pattern = re.compile(rf"\b(?:{'|'.join(cast)})\b")
    maps = [{w: invented[(i + c) % k] for i, w in enumerate(cast)} for c in range(k)]
    return [lambda s, m=m: pattern.sub(lambda found: m[found.group(0)], s) for m in maps]


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


_COSTS: dict[tuple, int] = {}  # (tokenizer, text) -> its tokens: passages are tried many times over


def _costs(tokenizer, sentences: list[str], variants) -> list[int]:
    """Per sentence, the most tokens any of its variants takes."""
    texts = [variants(s) for s in sentences]
    key = (type(tokenizer).__name__, getattr(tokenizer, "name_or_path", ""), len(tokenizer))
    missing = list(dict.fromkeys(t for group in texts for t in group if (key, t) not in _COSTS))
    if missing:
        if len(_COSTS) > 1 << 18:
            _COSTS.clear()
        ids = tokenizer(missing, add_special_tokens=False, verbose=False)["input_ids"]
        _COSTS.update({(key, t): len(i) for t, i in zip(missing, ids)})
    return [max(_COSTS[key, t] for t in group) for group in texts]


def _names_nobody(chunk: list[tuple], novel: Novel) -> bool:
    """No name of the novel anywhere in the chunk, and no other word capitalised mid-sentence (a rarer name)."""
    text = " ".join(s for s, _ in chunk)
    return not set(CAPITAL.findall(text)) & novel.names and not MID_SENTENCE.search(text)


def _sentence_of(rng: random.Random, chunk: list[tuple]) -> str:
    """A sentence of the chunk for the query: one of 6 to 60 words with a pronoun where there is one, else one of 6
    to 60 words, else its longest."""
    sentences = [s for s, _ in chunk]
    fitting = [s for s in sentences if 6 <= len(s.split()) <= 60]
    fitting = [s for s in fitting if any(w.lower() in PRONOUNS for w in WORD.findall(s))] or fitting
    return rng.choice(fitting) if fitting else max(sentences, key=len)


def _joined(chunks: list[list[tuple]]) -> list[str]:
    """The chunks' texts: sentences joined by a space, by a blank line where a paragraph ends and after a chunk."""
    texts = []
    for chunk in chunks:
        last = len(chunk) - 1
        texts.append("".join(s + ("" if i == last else "\n\n" if ends else " ") for i, (s, ends) in enumerate(chunk)))
    return [t + ("\n\n" if i < len(texts) - 1 else "") for i, t in enumerate(texts)]
