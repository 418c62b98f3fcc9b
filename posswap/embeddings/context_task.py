"""The documents of the contextual chunk retrieval task: facts whose chunk does not name what they are about.

Each document is a stretch of held-out natural text (*Persuasion* and the Python documentation, in turn) cut into
chunks at sentence ends within ``chunk_tokens``. One subject (a person, a company, a town or a book, invented, so
no haystack names it) is named in one chunk, by an introducing sentence or by a section heading; two facts about it
sit in two later chunks, each referring to it by a pronoun or a definite description only ("She keeps a tortoise",
"The firm makes brass hinges"). The query names the subject and asks for one fact ("What pet does Wren Okafor
keep?"): a chunk read alone cannot tell whose tortoise it is; a chunk read in its document can.

Every document of one kind holds the same two questions, so among the fact chunks that answer a question a model
that reads chunks alone is at chance (one in the documents of that kind). The four templates (naming x reference)
are posswap's evaluation's own: no recipe trains on them. Distances (fact chunk - naming chunk) are drawn
log-uniformly from 1 to the document's last chunk. Everything is seeded with strings, as the other tasks are.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass

from ..data import read_document
from .retrieval_tasks import special_tokens

HAYSTACKS = ("persuasion", "python-docs")
KINDS = ("person", "company", "town", "book")
TEMPLATES = ("intro-pronoun", "intro-description", "heading-pronoun", "heading-description")
FIRST = "Wren Tamsin Orrin Ysolde Caspian Briony Lucan Maelis Torin Odessa Fenwick Idris Saoirse Ambrose Leocadia Jory Perpetua Ewan Isolde Cadoc Marisol Aurek Nerys Piran Zelie Bastian Oriel Kestrel Ione Corwin".split()
LAST = "Okafor Lindqvist Quintero Zielinski Abernathy Bergstrom Chowdhury Dimitrov Valdez Xiong Rasmussen Takahashi Umarov Kowalski Nakamura Ibarra Hoang Jovanovic Petrov Salazar Espinoza Gallagher Whitaker Yamamoto Moreno Delgado Castillo Bautista Fitzgerald Alvarez".split()
FIRM = "Brightwater Harrowgate Quillon Marchbank Thornfield Ashgrove Pellham Kestwick Dunmore Selbury Ravensholt Corbridge Wetherby Lyndale Ambleworth Stanmere Holloway Fernleigh Caldwick Oakhurst Tilbrook Wrenfield Blackmoor Greystone Aldwick Ellerby".split()
FIRM_END = "Mills Works Foundry Company Brothers Partners Industries Manufactory Trading Supply".split()
TOWN = "Ashcombe Bramwick Eastholm Farleigh Glenmoor Hartwell Kingsmead Loxley Marrowby Northam Oakenfold Penhallow Quarrendon Rushbrook Saltmarsh Thornbury Upwell Wexcombe Yarlington Zennor Brackenfield Colderby Dunsop Elmstead Frogmore Gorran".split()
ADJECTIVE = "Silver Hidden Distant Broken Quiet Burning Golden Frozen Hollow Scarlet Wandering Sleeping Forgotten Crooked Painted Drowned Velvet Iron Glass Ivory Amber Copper Ashen Bitter Gentle Midnight".split()
NOUN = "Orchard Lantern Harbour Meadow Compass Garden Bell Staircase Mirror Chapel Bridge Kingdom Voyage Lighthouse Tapestry Archive Citadel Forest Quarry Pilgrim Carousel Sparrow Cellar Falconer Ferryman Weaver".split()

# kind -> (how it is introduced, the description that refers to it, its pronoun(s)).
INTRO = {
    "person": ("{name} had lately come to live in the neighbourhood.", "The newcomer", ("She", "He")),
    "company": ("{name} is a firm of long standing in the district.", "The firm", ("It",)),
    "town": ("{name} is a market town some miles to the west.", "The town", ("It",)),
    "book": ("{name} is a novel that few people now remember.", "The novel", ("It",)),
}
# kind -> its two questions: (relation, fact sentence after the reference, query, values).
RELATIONS = {
    "person": (
        (
            "pet",
            "keeps a {value} in the garden behind the house.",
            "What pet does {name} keep?",
            "tortoise parrot greyhound ferret canary goat hedgehog spaniel rabbit peacock donkey owl".split(),
        ),
        (
            "instrument",
            "plays the {value} every evening after supper.",
            "Which instrument does {name} play?",
            "cello harp oboe viola flute trumpet bassoon clarinet harpsichord lute organ fiddle".split(),
        ),
    ),
    "company": (
        (
            "product",
            "makes {value} for customers all over the country.",
            "What does {name} make?",
            [
                "brass hinges",
                "paper lanterns",
                "wool blankets",
                "glass bottles",
                "copper kettles",
                "leather saddles",
                "iron nails",
                "silk ribbons",
                "clay pipes",
                "oak barrels",
                "tin whistles",
                "wax candles",
            ],
        ),
        (
            "founded",
            "was founded in {value} by two brothers.",
            "When was {name} founded?",
            [str(y) for y in range(1791, 1891, 9)],
        ),
    ),
    "town": (
        (
            "known",
            "is best known for its {value}.",
            "What is {name} known for?",
            [
                "cheese market",
                "stone bridge",
                "horse fair",
                "cathedral spire",
                "salt baths",
                "apple orchards",
                "lace makers",
                "clock tower",
                "oyster beds",
                "paper mill",
                "windmills",
                "hot springs",
            ],
        ),
        (
            "river",
            "stands where the river {value} meets the sea.",
            "Which river does {name} stand on?",
            "Tamar Exe Wear Tees Ouse Severn Dart Fowey Camel Avon Lune Eden".split(),
        ),
    ),
    "book": (
        (
            "topic",
            "tells the story of {value}.",
            "What is {name} about?",
            [
                "a lighthouse keeper's daughter",
                "a shipwrecked surgeon",
                "two rival bakers",
                "an exiled astronomer",
                "a travelling circus",
                "a blind clockmaker",
                "a smuggler's widow",
                "a runaway apprentice",
                "a haunted mill",
                "a balloon voyage",
                "a stolen violin",
                "a village schoolmistress",
            ],
        ),
        (
            "printed",
            "was first printed in {value}.",
            "When was {name} first printed?",
            [str(y) for y in range(1702, 1802, 9)],
        ),
    ),
}


@dataclass(frozen=True)
class Templates:
    """What a task's documents are made of: per kind the words its names are made from (``name`` formats them),
    how a subject is introduced and referred to, its two questions, the naming x reference templates used, and the
    haystacks. :data:`EVALUATION` is the evaluation's; a recipe brings its own, disjoint from it."""

    words: dict  # kind -> word lists; the first is drawn without replacement, so every name in a task differs
    name: dict  # kind -> format of the words: "{0} {1}"
    intro: dict  # kind -> (introducing sentence(s), description(s), pronouns): one drawn where several
    relations: dict  # kind -> (relation, fact, query, values) each; two drawn per document where more
    templates: tuple[str, ...]
    haystacks: tuple[str, ...]


EVALUATION = Templates(
    words={"person": (FIRST, LAST), "company": (FIRM, FIRM_END), "town": (TOWN,), "book": (ADJECTIVE, NOUN)},
    name={"person": "{0} {1}", "company": "{0} {1}", "town": "{0}", "book": "The {0} {1}"},
    intro=INTRO,
    relations=RELATIONS,
    templates=TEMPLATES,
    haystacks=HAYSTACKS,
)
QUESTIONS_PER_DOCUMENT = 2  # a document's two facts, each asked once: a task's queries go document by document
SENTENCE = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclass(frozen=True)
class ContextQuery:
    query: str
    document: int
    chunk: int  # the fact's chunk in its document
    relation: str  # the question: every document of a kind has its two
    template: str
    distance: int  # fact chunk - naming chunk


@dataclass(frozen=True)
class ContextTask:
    """One length: ``chunks[d]`` are the pieces of document ``d`` (joined, the document)."""

    length: int
    chunk_tokens: int
    chunks: list[list[str]]
    subjects: list[str]
    naming_chunks: list[int]
    queries: list[ContextQuery]

    @property
    def documents(self) -> list[str]:
        return ["".join(pieces) for pieces in self.chunks]

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for text in [p for pieces in self.chunks for p in pieces] + [q.query for q in self.queries]:
            digest.update(text.encode("utf-8") + b"\0")
        return digest.hexdigest()


def build_context_task(
    tokenizer, length: int, documents: int, seed: int, chunk_tokens: int = 128, templates: Templates = EVALUATION
) -> ContextTask:
    """``documents`` documents of at most ``length`` tokens (special tokens counted) in chunks of at most
    ``chunk_tokens``; at least three chunks a document (inputs checked by the caller)."""
    tag = "" if templates is EVALUATION else "-" + "-".join(templates.haystacks)
    rng = random.Random(f"posswap-context-{length}-{chunk_tokens}-{seed}{tag}")
    subjects = _subjects(random.Random(f"posswap-context-subjects-{seed}{tag}"), documents, templates)
    special = special_tokens(tokenizer)
    per_chunk = chunk_tokens - special
    count = (length - special) // per_chunk
    sentences = {h: _sentences(h) for h in templates.haystacks}
    chunks, naming, queries = [], [], []
    for d, (kind, name) in enumerate(subjects):
        plan = _plan(rng, kind, name, count, d, templates)
        pieces = _fill(tokenizer, rng, sentences[haystack_of(d, templates.haystacks)], plan, count, per_chunk, name)
        chunks.append(pieces)
        naming.append(plan["naming"])
        queries += [
            ContextQuery(q, d, chunk, rel, plan["template"], chunk - plan["naming"])
            for q, chunk, rel in plan["queries"]
        ]
    return ContextTask(length, chunk_tokens, chunks, [name for _, name in subjects], naming, queries)


def haystack_of(document: int, haystacks: tuple[str, ...] | list[str]) -> str:
    """The text document ``document`` of a task is cut from: the haystacks in turn."""
    return haystacks[document % len(haystacks)]


def _subjects(rng: random.Random, documents: int, templates: Templates) -> list[tuple[str, str]]:
    """(kind, name) per document, kinds in turn; the first word of every name differs."""
    pools = {}
    for kind in KINDS:
        first, *rest = templates.words[kind]
        columns = [rng.sample(first, len(first))] + [rng.choices(words, k=len(first)) for words in rest]
        pools[kind] = [templates.name[kind].format(*row) for row in zip(*columns)]
    return [(KINDS[d % 4], pools[KINDS[d % 4]][d // 4]) for d in range(documents)]


def max_context_documents(templates: Templates = EVALUATION) -> int:
    return len(KINDS) * min(len(templates.words[kind][0]) for kind in KINDS)


def _plan(rng: random.Random, kind: str, name: str, count: int, document: int, templates: Templates) -> dict:
    """Where the subject is named, which chunks hold its two facts, and the inserted sentences."""
    template = templates.templates[(document // 4) % len(templates.templates)]
    naming_form, reference_form = template.split("-")
    intro, description, pronouns = templates.intro[kind]
    intro = intro if isinstance(intro, str) else rng.choice(intro)  # a recipe's templates vary their wording
    description = description if isinstance(description, str) else rng.choice(description)
    reference = description if reference_form == "description" else rng.choice(pronouns)
    relations = templates.relations[kind]
    relations = relations if len(relations) == 2 else rng.sample(relations, 2)
    first = _distance(rng, count - 1)
    second = _distance(rng, count - 1, avoid=first)
    start = rng.randrange(0, count - max(first, second))
    inserts = {start: [("heading" if naming_form == "heading" else "sentence", _naming(naming_form, intro, name))]}
    queries = []
    for (relation, fact, query, values), distance in zip(relations, (first, second)):
        allowed = [v for v in values if not _words(v) & _words(name)]  # a fact never names its subject
        sentence = f"{reference} {fact.format(value=rng.choice(allowed))}"
        inserts.setdefault(start + distance, []).append(("sentence", sentence))
        queries.append((query.format(name=name), start + distance, relation))
    return {"template": template, "naming": start, "inserts": inserts, "queries": queries}


def _naming(form: str, intro: str, name: str) -> str:
    return name if form == "heading" else intro.format(name=name)


def _distance(rng: random.Random, most: int, avoid: int | None = None) -> int:
    """A distance from 1 to ``most`` chunks, log-uniform (P(d) ~ log((d + 1) / d)); another than ``avoid`` where
    there is one."""
    choices = [d for d in range(1, most + 1) if d != avoid] or [most]
    return rng.choices(choices, weights=[math.log((d + 1) / d) for d in choices])[0]


def _sentences(haystack: str) -> list[list[str]]:
    """The haystack's paragraphs as lists of sentences, whitespace inside a paragraph made single spaces."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", read_document(haystack))]
    return [SENTENCE.split(p) for p in paragraphs if p]


def _fill(tokenizer, rng: random.Random, paragraphs, plan: dict, count: int, budget: int, name: str) -> list[str]:
    """``count`` chunks of haystack sentences from a random paragraph on, each within ``budget`` tokens with the
    plan's sentences inserted at sentence ends (a heading first in its chunk). A haystack sentence that names a word
    of the subject, or is longer than a chunk, is passed over."""
    words = _words(name) - {"the"}
    at = rng.randrange(len(paragraphs))
    queue: list[tuple[str, bool]] = []  # (sentence, ends its paragraph)
    pieces = []
    for c in range(count):
        inserts = plan["inserts"].get(c, [])
        room = budget - sum(_tokens(tokenizer, s) for _, s in inserts)
        body, at = _take(tokenizer, paragraphs, at, queue, room, words)
        pieces.append(_compose(rng, body, inserts))
    joined = ["".join(p) for p in pieces]
    return [p + ("\n\n" if i < len(joined) - 1 else "") for i, p in enumerate(joined)]


def _take(tokenizer, paragraphs, at: int, queue: list, room: int, words: set) -> tuple[list, int]:
    """Haystack sentences worth at most ``room`` tokens (the queue refilled from paragraph ``at`` on); a sentence
    that names a word of the subject, or is longer than half a chunk (a code block, a very long sentence: the chunks
    would be left half empty), is dropped."""
    body, used = [], 0
    while True:
        if not queue:
            paragraph = paragraphs[at % len(paragraphs)]
            queue.extend((s, i == len(paragraph) - 1) for i, s in enumerate(paragraph))
            at += 1
        sentence, ends = queue[0]
        cost = _tokens(tokenizer, sentence)
        if words & _words(sentence) or 2 * cost > room:
            queue.pop(0)
            continue
        if used + cost > room:
            return body, at
        body.append((sentence, ends))
        used += cost
        queue.pop(0)


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


def _compose(rng: random.Random, body: list, inserts: list) -> list[str]:
    """The chunk's text as parts: a heading first as its own paragraph, other inserts at random sentence ends."""
    sentences = [s for s, _ in body]
    breaks = [ends for _, ends in body]
    for kind, text in inserts:
        if kind == "heading":
            continue
        where = rng.randrange(len(sentences) + 1)
        sentences.insert(where, text)
        breaks.insert(where, False)
    parts = []
    for i, (sentence, ends) in enumerate(zip(sentences, breaks)):
        last = i == len(sentences) - 1
        parts.append(sentence + ("" if last else "\n\n" if ends else " "))
    heading = [text + "\n\n" for kind, text in inserts if kind == "heading"]
    return heading + parts


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"])
