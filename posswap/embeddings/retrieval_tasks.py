"""The documents and queries of LongEmbed's two synthetic retrieval tasks (Zhu et al. 2024, "LongEmbed: Extending
Embedding Models for Long Context Retrieval", section 3.2), built from posswap's embedded public-domain corpus.

- **passkey** (personalized passkey retrieval, after Wang et al. 2023): every document is LongEmbed's garbage
  filler ("The grass is green. The sky is blue. ...") repeated, with one sentence "NAME's pass key is NNNNN.
  Remember it. NNNNN is the pass key for NAME." inside; the query is "What is the pass key for NAME?".
- **needle** (needle-in-a-haystack retrieval): a stretch of a long text (LongEmbed: Paul Graham's essays; here
  *Persuasion*, the novel no posswap recipe trains on) with one fact inside; the query is a question that only
  that fact answers. The 100 facts and questions are posswap's own (LongEmbed had GPT-4 write its 100).

Every document of one length has exactly that many tokens of the given tokenizer (special tokens counted, so a
512-token document is what a 512-position model reads whole). Needles sit at depth buckets: document ``i`` is in
bucket ``i % depth_buckets`` and its needle starts at a seeded random depth inside that bucket (depth = haystack
tokens before the needle / all haystack tokens), at a sentence end when the bucket has one. Everything is drawn
from ``random.Random`` seeded with strings, so a seed gives the same documents on every machine.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from ..data import read_document

TASKS = ("passkey", "needle")
DEFAULT_HAYSTACK = {"passkey": "filler", "needle": "persuasion"}
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

FIRST_NAMES = (
    "Avery Brooklyn Caden Dakota Emerson Finley Greyson Harper Indigo Jaxon Kendall Logan Marley Nova Oakley "
    "Peyton Quinn Reese Sawyer Tatum Uriah Vera Wren Xavier Yusuf Zara Aria Bodhi Cruz Delilah"
).split()
SURNAMES = (
    "Alvarez Bautista Castillo Delgado Espinoza Fitzgerald Gallagher Hoang Ibarra Jovanovic Kowalski Lindqvist "
    "Moreno Nakamura Okafor Petrov Quintero Rasmussen Salazar Takahashi Umarov Valdez Whitaker Xiong Yamamoto "
    "Zielinski Abernathy Bergstrom Chowdhury Dimitrov"
).split()

# (fact, question): each question is answered by its own fact only.
FACTS = (
    ("Water boils at 100 degrees Celsius at sea level.", "At what temperature does water boil at sea level?"),
    ("Light travels through a vacuum at about 299,792 kilometres per second.", "How fast does light travel?"),
    ("Isaac Newton published the law of universal gravitation in 1687.", "Who published the law of gravitation?"),
    ("The Mona Lisa was painted by Leonardo da Vinci.", "Who painted the Mona Lisa?"),
    ("The interior angles of a triangle add up to 180 degrees.", "What do the angles of a triangle add up to?"),
    ("Mount Everest is the highest mountain above sea level.", "Which mountain is the highest above sea level?"),
    ("The chemical symbol for gold is Au.", "What is the chemical symbol for gold?"),
    ("The Great Wall of China was built to keep out invaders from the north.", "Why was the Great Wall built?"),
    ("Alexander Fleming discovered penicillin in 1928.", "Who discovered penicillin?"),
    ("The Pacific is the largest ocean on Earth.", "Which ocean is the largest?"),
    ("A hexagon has six sides.", "How many sides does a hexagon have?"),
    ("The Battle of Hastings was fought in 1066.", "In which year was the Battle of Hastings fought?"),
    ("Jupiter is the largest planet in the Solar System.", "Which planet is the largest in the Solar System?"),
    ("The human heart has four chambers.", "How many chambers does the human heart have?"),
    ("The Starry Night was painted by Vincent van Gogh.", "Who painted The Starry Night?"),
    ("Albert Einstein formulated the theory of general relativity.", "Who formulated general relativity?"),
    ("The Nile is the longest river in Africa.", "Which is the longest river in Africa?"),
    ("The Pythagorean theorem relates the three sides of a right triangle.", "Which theorem is about right triangles?"),
    ("A molecule of DNA has the shape of a double helix.", "What shape does a DNA molecule have?"),
    ("Canberra is the capital city of Australia.", "What is the capital of Australia?"),
    ("Johannes Gutenberg brought printing with movable type to Europe.", "Who brought movable type to Europe?"),
    ("Photosynthesis makes sugar from carbon dioxide and water with sunlight.", "What does photosynthesis make?"),
    ("Michelangelo painted the ceiling of the Sistine Chapel.", "Who painted the Sistine Chapel ceiling?"),
    ("Mercury is the planet closest to the Sun.", "Which planet is closest to the Sun?"),
    ("Diamond is the hardest natural mineral.", "What is the hardest natural mineral?"),
    ("The French Revolution began in 1789.", "When did the French Revolution begin?"),
    ("Alexander Graham Bell patented the telephone in 1876.", "Who patented the telephone?"),
    ("The circumference of a circle is pi times its diameter.", "How is a circle's circumference computed?"),
    ("The Amazon is the largest tropical rainforest in the world.", "What is the largest tropical rainforest?"),
    ("Oxygen makes up about 21 percent of the air we breathe.", "How much of the air is oxygen?"),
    ("The Eiffel Tower was completed in 1889.", "When was the Eiffel Tower completed?"),
    ("Wolfgang Amadeus Mozart composed the opera The Magic Flute.", "Who composed The Magic Flute?"),
    ("The Sahara is the largest hot desert in the world.", "Which is the largest hot desert?"),
    ("An electron carries a negative electric charge.", "What charge does an electron carry?"),
    ("Neil Armstrong was the first person to walk on the Moon.", "Who first walked on the Moon?"),
    ("Tokyo is the capital of Japan.", "What is the capital of Japan?"),
    ("A prime number has exactly two divisors: one and itself.", "How many divisors does a prime number have?"),
    ("King John sealed the Magna Carta in 1215.", "Which king sealed the Magna Carta?"),
    ("Sound cannot travel through empty space.", "Can sound travel through empty space?"),
    ("A violin has four strings.", "How many strings does a violin have?"),
    ("The Rosetta Stone helped scholars read Egyptian hieroglyphs.", "What helped scholars read hieroglyphs?"),
    ("Venus is the hottest planet in the Solar System.", "Which planet is the hottest?"),
    ("Charles Darwin proposed evolution by natural selection.", "Who proposed evolution by natural selection?"),
    ("The Parthenon stands on the Acropolis of Athens.", "Where does the Parthenon stand?"),
    ("A cube has twelve edges.", "How many edges does a cube have?"),
    ("Marie Curie was the first to win Nobel Prizes in two sciences.", "Who won Nobel Prizes in two sciences?"),
    ("The Danube flows into the Black Sea.", "Into which sea does the Danube flow?"),
    ("Johannes Vermeer painted the Girl with a Pearl Earring.", "Who painted the Girl with a Pearl Earring?"),
    ("The Western Roman Empire fell in 476.", "In what year did the Western Roman Empire fall?"),
    ("Iron rusts when it reacts with oxygen and water.", "What makes iron rust?"),
    ("The cheetah is the fastest land animal.", "What is the fastest land animal?"),
    ("The Moon takes about 27 days to go round the Earth.", "How long does the Moon take to orbit the Earth?"),
    ("The American Declaration of Independence was signed in 1776.", "When was the Declaration signed?"),
    ("Beethoven composed nine symphonies.", "How many symphonies did Beethoven compose?"),
    ("The blue whale is the largest animal that has ever lived.", "What is the largest animal ever?"),
    ("Hydrogen is the lightest chemical element.", "What is the lightest element?"),
    ("The emperor Shah Jahan built the Taj Mahal for his wife.", "Who built the Taj Mahal?"),
    ("An octopus has three hearts.", "How many hearts does an octopus have?"),
    ("The Berlin Wall fell in 1989.", "When did the Berlin Wall fall?"),
    ("The rings of Saturn are made mostly of ice.", "What are Saturn's rings made of?"),
    ("The Louvre is the most visited art museum in the world.", "Which art museum has the most visitors?"),
    ("The square root of 144 is 12.", "What is the square root of 144?"),
    ("Honey bees show each other where flowers are with a waggle dance.", "How do bees show where flowers are?"),
    ("The Titanic sank in 1912 after striking an iceberg.", "What did the Titanic strike?"),
    ("The Odyssey is an epic poem attributed to Homer.", "Who is the Odyssey attributed to?"),
    ("Penguins live almost only in the Southern Hemisphere.", "In which hemisphere do penguins live?"),
    ("The Wright brothers made the first powered aeroplane flight in 1903.", "Who made the first powered flight?"),
    ("The Renaissance began in Italy in the fourteenth century.", "Where did the Renaissance begin?"),
    ("Bamboo is one of the fastest growing plants.", "Which plant grows fastest?"),
    ("France gave the Statue of Liberty to the United States.", "Which country gave the Statue of Liberty?"),
    ("Carbon is the element with atomic number six.", "Which element has atomic number six?"),
    ("An adult human skeleton has 206 bones.", "How many bones does an adult have?"),
    ("Leo Tolstoy wrote the novel War and Peace.", "Who wrote War and Peace?"),
    ("The Andes are the longest mountain range on land.", "Which is the longest mountain range on land?"),
    ("A leap year has 366 days.", "How many days does a leap year have?"),
    ("A compass needle points to the magnetic north pole.", "Where does a compass needle point?"),
    ("The Colosseum in Rome held about fifty thousand spectators.", "How many people did the Colosseum hold?"),
    ("Johann Sebastian Bach composed the Brandenburg Concertos.", "Who composed the Brandenburg Concertos?"),
    ("Lake Baikal in Siberia is the deepest lake in the world.", "Which is the deepest lake?"),
    ("The Silk Road linked China with the Mediterranean.", "What did the Silk Road link?"),
    ("Antibiotics kill bacteria but do not work against viruses.", "Do antibiotics work against viruses?"),
    ("The Sun is about 150 million kilometres from the Earth.", "How far away is the Sun?"),
    ("Pablo Picasso painted Guernica.", "Who painted Guernica?"),
    ("The Mariana Trench is the deepest part of the ocean.", "Where is the ocean deepest?"),
    ("A spider has eight legs.", "How many legs does a spider have?"),
    ("The Black Death swept across Europe in the 1340s.", "When did the Black Death sweep across Europe?"),
    ("Edward Jenner pioneered vaccination against smallpox.", "Who pioneered the smallpox vaccine?"),
    ("Iceland sits on the Mid-Atlantic Ridge.", "Which country sits on the Mid-Atlantic Ridge?"),
    ("Chess is played on a board of sixty-four squares.", "How many squares does a chess board have?"),
    ("The Hubble Space Telescope was launched in 1990.", "When was the Hubble telescope launched?"),
    ("The pyramids of Giza were built as tombs for the pharaohs.", "What were the pyramids of Giza built for?"),
    ("The giraffe is the tallest living animal.", "What is the tallest living animal?"),
    ("The Great Barrier Reef lies off the coast of Queensland.", "Where is the Great Barrier Reef?"),
    ("Galileo Galilei was tried by the Roman Inquisition in 1633.", "Who was tried by the Inquisition in 1633?"),
    ("The hummingbird is the only bird that can fly backwards.", "Which bird can fly backwards?"),
    ("The Suez Canal joins the Mediterranean Sea and the Red Sea.", "Which seas does the Suez Canal join?"),
    ("Rembrandt painted The Night Watch.", "Who painted The Night Watch?"),
    ("A decade is a period of ten years.", "How many years are there in a decade?"),
    ("The Industrial Revolution began in Britain.", "Where did the Industrial Revolution begin?"),
    ("Tea was first drunk in China.", "Where was tea first drunk?"),
)
SENTENCE_ENDS = (".", "!", "?")


@dataclass(frozen=True)
class RetrievalTask:
    """One length of one task: query ``i`` is answered by document ``i`` alone."""

    task: str
    length: int
    documents: list[str]
    queries: list[str]
    needles: list[str]
    depths: list[float]  # haystack tokens before the needle / all haystack tokens of the document
    buckets: list[int]  # the depth bucket each document was built for

    def fingerprint(self) -> str:
        """sha256 of the documents and queries: two runs with the same fingerprint read the same task."""
        digest = hashlib.sha256()
        for text in self.documents + self.queries:
            digest.update(text.encode("utf-8") + b"\0")
        return digest.hexdigest()


def max_documents(task: str) -> int:
    return len(FACTS) if task == "needle" else len(FIRST_NAMES) * len(SURNAMES)


def needles_and_queries(task: str, documents: int, seed: int) -> tuple[list[str], list[str]]:
    """The needle sentences and their queries: the same for every length of one seed."""
    rng = random.Random(f"posswap-retrieval-{task}-{seed}")
    if task == "needle":
        chosen = rng.sample(FACTS, documents)
        return [fact for fact, _ in chosen], [question for _, question in chosen]
    names = [
        f"{first} {last}" for first, last in rng.sample([(f, s) for f in FIRST_NAMES for s in SURNAMES], documents)
    ]
    keys = rng.sample(range(10_000, 100_000), documents)
    needles = [
        f"{name}'s pass key is {key}. Remember it. {key} is the pass key for {name}." for name, key in zip(names, keys)
    ]
    return needles, [f"What is the pass key for {name}?" for name in names]


def haystack_words(haystack: str) -> list[str]:
    """``filler`` (LongEmbed's passkey filler) or an embedded document ('persuasion', 'kjv', ...) as words."""
    return (FILLER if haystack == "filler" else read_document(haystack)).split()


def haystack_tokens(tokenizer, haystack: str) -> int | None:
    """Tokens of an embedded document as a haystack (None for the filler, which repeats by design)."""
    if haystack == "filler":
        return None
    words = haystack_words(haystack)
    counts = _word_counts(tokenizer, words)
    return sum(counts[w] for w in words)


def special_tokens(tokenizer) -> int:
    """Tokens the tokenizer adds to every text ([CLS] and [SEP] for BERT, none for GPT-2)."""
    return len(tokenizer("a")["input_ids"]) - len(tokenizer("a", add_special_tokens=False)["input_ids"])


def _count(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]


def shortest_length(tokenizer, needles: list[str], depth_buckets: int) -> int:
    """The shortest document that holds the longest needle and one haystack token per depth bucket."""
    return special_tokens(tokenizer) + max(_count(tokenizer, [" " + n for n in needles])) + depth_buckets


def build_task(
    task: str,
    tokenizer,
    length: int,
    documents: int,
    seed: int,
    haystack: str | None = None,
    depth_buckets: int = 5,
) -> RetrievalTask:
    """``documents`` documents of exactly ``length`` tokens and their queries (inputs checked by the caller)."""
    haystack = haystack or DEFAULT_HAYSTACK[task]
    needles, queries = needles_and_queries(task, documents, seed)
    words = haystack_words(haystack)
    counts = _word_counts(tokenizer, words)
    rng = random.Random(f"posswap-retrieval-{task}-{haystack}-{length}-{seed}")
    starts = [0] if haystack == "filler" else [i + 1 for i, w in enumerate(words[:-1]) if w.endswith(SENTENCE_ENDS)]
    texts, depths, buckets = [], [], []
    for i, needle in enumerate(needles):
        bucket = i % depth_buckets
        depth = (bucket + rng.random()) / depth_buckets
        text, actual = _document(
            tokenizer, words, counts, rng.choice(starts), needle, length, depth, bucket, depth_buckets
        )
        texts.append(text)
        depths.append(actual)
        buckets.append(bucket)
    return RetrievalTask(task, length, texts, queries, needles, depths, buckets)


def _word_counts(tokenizer, words: list[str]) -> dict[str, int]:
    """Tokens of each distinct word when it follows a space (BERT splits on spaces; GPT-2's pre-tokenizer too,
    with the space in the word's first token), so a text's length is the sum over its words."""
    unique = sorted(set(words))
    return dict(zip(unique, _count(tokenizer, [" " + w for w in unique])))


def _document(tokenizer, words, counts, start, needle, length, depth, bucket, buckets) -> tuple[str, float]:
    budget = length - special_tokens(tokenizer) - _count(tokenizer, [" " + needle])[0]
    hay = _take(words, counts, start, budget)
    cut = _insertion_point(hay, counts, budget, depth, bucket, buckets)
    text = _fit(tokenizer, hay, cut, needle, length, words, counts, start + len(hay))
    before = text[: text.index(needle)].rstrip()
    return text, _count(tokenizer, [before])[0] / budget if before else 0.0


def _take(words: list[str], counts: dict[str, int], start: int, budget: int) -> list[str]:
    """Words from ``start`` on (wrapping round) worth exactly ``budget`` tokens: a word longer than what is left
    near the end is skipped, so the last tokens are filled with short words of the text that follows."""
    taken, total, i = [], 0, start
    while total < budget:
        word = words[i % len(words)]
        if total + counts[word] <= budget:
            taken.append(word)
            total += counts[word]
        i += 1
        if i - start > 4 * len(words) + budget:  # no word short enough: cannot happen with real text
            raise ValueError(f"Cannot fill {budget} tokens from this haystack.")
    return taken


def _insertion_point(hay: list[str], counts, budget: int, depth: float, bucket: int, buckets: int) -> int:
    """The word index to put the needle before: inside the bucket's token range, nearest the drawn depth,
    preferring a sentence end (or the start)."""
    positions, total = [], 0
    for word in hay:
        positions.append(total)
        total += counts[word]
    positions.append(total)
    low, high = bucket / buckets * budget, (bucket + 1) / buckets * budget
    inside = [j for j, p in enumerate(positions) if low <= p < high or (bucket == buckets - 1 and p == high)]
    if not inside:  # a bucket narrower than one word: the nearest boundary
        inside = list(range(len(positions)))
    sentence = [j for j in inside if j == 0 or hay[j - 1].endswith(SENTENCE_ENDS)]
    return min(sentence or inside, key=lambda j: abs(positions[j] - depth * budget))


def _fit(tokenizer, hay, cut, needle, length, words, counts, next_word) -> str:
    """Join the words and the needle, then trim or extend the end until the text is exactly ``length`` tokens
    (word counts are exact for BERT and GPT-2 tokenizers; this catches any tokenizer where they are not)."""
    before, after = hay[:cut], hay[cut:]
    for _ in range(64):
        text = " ".join(before + [needle] + after)
        excess = len(tokenizer(text, verbose=False)["input_ids"]) - length
        if excess == 0:
            return text
        if excess > 0 and after:
            after = after[:-1]
        elif excess > 0:
            before = before[1:]
        else:
            word = words[next_word % len(words)]
            next_word += 1
            if counts[word] <= -excess:
                after = after + [word]
    raise ValueError(f"Could not build a document of exactly {length} tokens with this tokenizer.")
