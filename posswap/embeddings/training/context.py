"""Late chunks that carry their document (``embedding.context_pairs``): documents of the training text with an
invented subject named in one chunk and facts about it in later chunks that do not name it, built as the context
task builds its documents (:mod:`posswap.embeddings.context_task`) but from the recipe's own templates: other
names, other introductions and descriptions, other questions, and no section headings, so that every template the
evaluation scores is one no recipe trained on.

Each row is a document and one question about its subject; the loss is a ranking over every chunk of every
document of the batch (the question's own document's other chunks, its naming chunk among them, are the hardest
negatives): the fact's chunk, its tokens mean-pooled while the model reads the whole document, must come first.
The documents are cut from the recipe's novels, or from the texts ``embedding.context_haystacks`` names (the
SQLite documentation beside them: technical prose, as half of the context task's).

``embedding.context_source: natural`` (or ``both``) makes the documents from real passages instead: one passage of
the recipe's novels in two copies, two people's invented names swapped between them, each copy asked about the same
chunk that names nobody by the name its subject has there (a batch holds several passages, both copies of each) (:mod:`posswap.embeddings.natural_context`): no
template to learn, only context.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import datasets
import torch
import torch.nn.functional as F
from torch import nn

from ..chunking import after_pooling, mean_pooling_index
from ..context_task import EVALUATION, KINDS, Templates, build_context_task
from ..natural_context import NaturalSource, build_natural_task

SYLLABLES = (
    "al bar bel bor bran cal cas cor dal dar del dun el fal fen gar gil hal har hel hol ir jas ker kil lan lor "
    "mal mar mel mor nel nor ol or pel per quel ran ren rol sal sel sor tal tam tor ul val ven vor wal wen yar zel"
).split()
TOWN_ENDS = "ford bury ton ham wick mouth stead combe leigh thorpe field bridge minster haven".split()
FIRM_ENDS = "Holdings Limited Associates Carriers Outfitters Merchants Bakeries Printers Tanners Shipwrights".split()
BOOK_WORDS = (
    "Crimson Emerald Gilded Lonely Merry Northern Patient Restless Secret Shining Southern Stubborn Tender "
    "Twilight Wicked Winter Autumn Bright Cloudy Dusky Faithful Gallant Humble Jolly Lofty Noble Proud Rustic "
    "Solemn Weary".split(),
    "Shepherd Governess Admiral Pilgrimage Inheritance Cottage Sister Tide Promise Letter Journey Masquerade "
    "Orphan Duel Heiress Locket Regiment Vicarage Parlour Ballroom Wager Portrait Elopement".split(),
)


GIVEN = (
    "Agatha Barnaby Clement Dorothea Edmund Felicity Gideon Harriet Ignatius Juliana Lavinia Montague Nathaniel "
    "Ophelia Peregrine Rosalind Sebastian Theodora Ulric Verity Winifred Xavier Yolanda Zachary Beatrix Cornelius "
    "Drusilla Evander Florian Griselda Horatio Imogen Jasper Katrina Leopold Millicent Octavia Percival Quentin "
    "Rowena Silas Thomasina Valentine Wilhelmina Alaric Cecily Digby Esme Fitzroy Gwendolen Humphrey Isadora Jocasta "
    "Lysander Mirabel Nicodemus Philippa Reginald Seraphina Tobias Ursula Vivian"
).split()
FAMILY = (
    "Ashworth Blackwood Cartwright Drummond Ellsworth Fairbanks Goodwin Hargreaves Ingram Jennings Kingsley Lockhart "
    "Merriweather Northcott Osborne Pemberton Radcliffe Sutherland Thackeray Underwood Vance Wainwright Yardley "
    "Ackroyd Braithwaite Crowther Dunstan Eversley Fothergill Grimshaw Hollis Inchbald Jessop Kettering Langley "
    "Mortimer Nettleton Oakley Pickering Rutherford Stanhope Tolliver Upton Villiers Whitlock"
).split()
TOWN_STARTS = (
    "Ash Black Bright Cold Deep Elm Fair Green High Long Mill Moor New Old Red Salt Stan Stone West White".split()
)


def _names(kind: str, count: int = 2000) -> list[str]:
    """``count`` invented names of a kind (a fixed seed: the same names on every machine), half made of syllables and
    half of name-like words, none sharing a word with the evaluation's: the model cannot learn the names, only
    where they are."""
    rng = random.Random(f"posswap-context-training-names-{kind}")
    taken = {w.lower() for words in EVALUATION.words.values() for pool in words for w in pool}
    word = lambda n: "".join(rng.choice(SYLLABLES) for _ in range(n)).capitalize()  # noqa: E731
    made: set[str] = set()
    attempt = 0
    while len(made) < count:
        name = _name(kind, rng, word, plain=attempt % 2 == 0)  # by attempt: name-like words run out first (towns: 280)
        if not {w.lower() for w in name.split()} & taken:
            made.add(name)
        attempt += 1
    return sorted(made)


def _name(kind: str, rng: random.Random, word, plain: bool) -> str:
    """One name: of name-like words where ``plain``, else of syllables."""
    if kind == "person":
        return f"{rng.choice(GIVEN)} {rng.choice(FAMILY)}" if plain else f"{word(2)} {word(rng.choice((2, 3)))}"
    if kind == "company":
        first = rng.choice(FAMILY) if plain else word(rng.choice((2, 3)))
        return f"{first} {rng.choice(FIRM_ENDS)}"
    if kind == "town":
        return (rng.choice(TOWN_STARTS) if plain else word(rng.choice((1, 2)))) + rng.choice(TOWN_ENDS)
    tail = f" of {rng.choice(FAMILY)}" if plain else f" of {word(2)}"
    return f"The {rng.choice(BOOK_WORDS[0])} {rng.choice(BOOK_WORDS[1])}" + (tail if rng.random() < 0.5 else "")


def _relation(name: str, fact: str, query: str, values: str) -> tuple:
    return (name, fact, query, values.split(","))


TRAINING = Templates(
    words={kind: (_names(kind),) for kind in KINDS},
    name={kind: "{0}" for kind in KINDS},
    intro={
        "person": (
            ("Everyone in the parish had heard of {name}.", "A letter arrived from {name} that morning.",
             "Among the guests was {name}.", "{name} was spoken of at every dinner that winter.",
             "Nobody could say where {name} had come from."),
            ("This person", "Our visitor", "The stranger", "That good soul", "The lodger"),
            ("She", "He"),
        ),
        "company": (
            ("Trade in the county owed much to {name}.", "{name} opened its doors in the high street.",
             "The papers were full of {name} that year.", "Half the town worked for {name}."),
            ("The business", "The concern", "The house of trade", "The enterprise"),
            ("It",),
        ),
        "town": (
            ("The coach road passes through {name}.", "We stopped for the night at {name}.",
             "{name} lies in a fold of the hills.", "The letter was posted from {name}."),
            ("The place", "The village", "The borough", "The settlement"),
            ("It",),
        ),
        "book": (
            ("Many readers still speak of {name}.", "On the table lay a copy of {name}.",
             "{name} was the talk of the season.", "She had borrowed {name} from the library."),
            ("This book", "The volume", "The work", "The tale"),
            ("It",),
        ),
    },
    relations={
        "person": (
            _relation("colour", "is fond of anything {value} in colour.", "What colour does {name} like?",
                      "green,scarlet,yellow,violet,crimson,blue,grey,amber,white,golden"),
            _relation("street", "lives in a narrow house on {value} Street.", "On which street does {name} live?",
                      "Cherry,Mill,Bridge,Castle,Church,Market,Queen,Abbey,Water,Chapel"),
            _relation("sport", "rides out to {value} whenever the weather allows.", "Which sport does {name} enjoy?",
                      "hunt,fish,race,hawk,sail,shoot"),
            _relation("food", "will eat {value} at every meal.", "What food does {name} love?",
                      "mutton,oysters,plum cake,cheese,pears,herring,bread and honey"),
            _relation("job", "works as a {value} in the town.", "What is the trade of {name}?",
                      "glazier,saddler,chandler,cooper,bookbinder,apothecary,surveyor,milliner"),
            _relation("sibling", "has a {value} who lives abroad.", "Which relation of {name} lives abroad?",
                      "brother,sister,cousin,niece,nephew,uncle,aunt"),
            _relation("horse", "rides a {value} horse to church.", "What horse does {name} ride?",
                      "grey,black,chestnut,bay,white,piebald"),
            _relation("grows", "grows {value} in a little plot by the gate.", "What does {name} grow?",
                      "roses,turnips,tulips,strawberries,herbs,onions,lilies"),
            _relation("language", "speaks {value} as well as English.", "Which language does {name} speak?",
                      "French,Italian,German,Spanish,Dutch,Welsh,Latin"),
            _relation("game", "plays {value} with the curate every week.", "Which game does {name} play?",
                      "chess,whist,draughts,backgammon,cribbage,billiards"),
        ),
        "company": (
            _relation("workers", "employs {value} workers in its sheds.", "How many people does {name} employ?",
                      "forty,ninety,three hundred,six hundred,twelve,eighty"),
            _relation("buyers", "sells mostly to {value}.", "Who buys from {name}?",
                      "farmers,sailors,schools,the army,bakers,hospitals,railways,tailors"),
            _relation("owner", "is owned by a {value} from the north.", "Who owns {name}?",
                      "widow,banker,clergyman,sea captain,physician,duke"),
            _relation("premises", "keeps its offices in an old {value}.", "Where does {name} keep its offices?",
                      "chapel,granary,warehouse,coaching inn,mill,customs house"),
            _relation("fire", "lost its warehouse to a fire in {value}.", "When did {name} suffer a fire?",
                      "1820,1833,1841,1856,1862,1874,1889"),
            _relation("carriage", "sends its goods by {value}.", "How does {name} send its goods?",
                      "canal,rail,sea,coach,cart,river barge"),
            _relation("motto", "has the motto '{value}' painted over its door.", "What is the motto of {name}?",
                      "Honest Work,Always Ready,Steady and True,Built to Last,Fair Prices"),
            _relation("rival", "competes with a rival house in {value}.", "Where is the rival of {name}?",
                      "Leeds,Bristol,Glasgow,Norwich,Exeter,Dublin,York"),
        ),
        "town": (
            _relation("festival", "holds a {value} festival every summer.", "What festival does {name} hold?",
                      "music,flower,boat,kite,lantern,bread,wool,cider"),
            _relation("people", "has about {value} inhabitants.", "How many people live in {name}?",
                      "two thousand,five thousand,nine hundred,twelve thousand,forty thousand"),
            _relation("market", "holds its market every {value}.", "On which day is the market of {name}?",
                      "Monday,Tuesday,Wednesday,Thursday,Friday,Saturday"),
            _relation("church", "has a church dedicated to Saint {value}.", "To which saint is the church of {name} dedicated?",
                      "Michael,Mary,Peter,Andrew,Giles,Margaret,Nicholas"),
            _relation("flood", "was flooded in the great storm of {value}.", "When was {name} flooded?",
                      "1703,1760,1795,1811,1839,1852"),
            _relation("inn", "has an inn called the {value}.", "What is the inn of {name} called?",
                      "Red Lion,White Hart,Crown,Bell,Swan,Plough,Black Bull"),
            _relation("mayor", "has a mayor who was once a {value}.", "What was the mayor of {name} before?",
                      "baker,sailor,soldier,teacher,miller,lawyer"),
            _relation("living", "lives by {value}.", "How does {name} make its living?",
                      "fishing,weaving,mining,farming,brewing,quarrying"),
        ),
        "book": (
            _relation("dedication", "is dedicated to the author's {value}.", "To whom is {name} dedicated?",
                      "mother,father,brother,sister,teacher,godson,physician,landlady"),
            _relation("pages", "runs to some {value} pages.", "How long is {name}?",
                      "two hundred,four hundred,six hundred,nine hundred,one thousand"),
            _relation("setting", "is set in {value}.", "Where is {name} set?",
                      "Venice,a mining village,a convent,the Scottish isles,a debtors' prison,a ship bound for India"),
            _relation("binding", "is bound in {value} leather.", "How is {name} bound?",
                      "green,red,calf,blue,black,brown"),
            _relation("price", "sold for {value} shillings a copy.", "What did {name} cost?",
                      "three,five,seven,ten,twelve,fifteen"),
            _relation("hero", "has a hero who is a {value}.", "Who is the hero of {name}?",
                      "soldier,vicar,sailor,poet,orphan,gardener,judge"),
            _relation("ending", "ends with a {value}.", "How does {name} end?",
                      "wedding,funeral,shipwreck,duel,reunion,journey"),
            _relation("readers", "was written for {value}.", "For whom was {name} written?",
                      "children,sailors,young ladies,scholars,farmers"),
        ),
    },
    templates=("intro-pronoun", "intro-description"),
    haystacks=("emma", "mansfieldpark", "northangerabbey", "prideprejudice", "sensesensibility"),
)  # fmt: skip


def _given_names(count: int = 300) -> tuple[str, ...]:
    """One-word given names made of syllables (a fixed seed), none a word of the evaluation's names: what a natural
    passage's main character is renamed to in training (the natural-reference task names copies from FIRST)."""
    rng = random.Random("posswap-natural-training-names")
    taken = {w.lower() for words in EVALUATION.words.values() for pool in words for w in pool}
    made: set[str] = set()
    while len(made) < count:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if name.lower() not in taken:
            made.add(name)
    return tuple(sorted(made))


# embedding.context_source natural: the recipe's novels (never Persuasion, the evaluation's), syllable names.
NATURAL_TRAINING = NaturalSource(TRAINING.haystacks, _given_names())
GROUPED = "posswap context pairs: each run of batch_size rows is one batch"
COPY_AT, SPANS_AT = 2, 3  # a label: fact chunk, chunk count, the other copy's row (-1: none), the chunks' spans


def training_templates(haystacks: tuple[str, ...] | None = None) -> Templates:
    """The recipe's templates, their documents cut from ``haystacks`` in turn (``embedding.context_haystacks``;
    None: the recipe's novels)."""
    return TRAINING if haystacks is None else dataclasses.replace(TRAINING, haystacks=tuple(haystacks))


def context_rows(
    tokenizer,
    lengths: list[int],
    rows: int,
    seed: int,
    chunk_tokens: int,
    group: int,
    source: str = "templates",
    haystacks: tuple[str, ...] | None = None,
) -> datasets.Dataset | None:
    """``rows`` (rounded down to whole groups) of ``query`` (a question about a document's subject), ``document``
    and ``label`` (the fact's chunk, the chunk count, the row of its group holding the other copy of a natural
    passage or -1, then each chunk's [start, end) in the document's text tokens, padded with -1), in groups of
    ``group`` rows: documents of one length and one kind that all answer the same question, each about its own
    subject. Trained as one batch (:func:`context_batch_sampler`), a group's other
    fact chunks say what the question asks and differ only in whose fact they are: the chunk must carry its
    subject, which only its document names. ``source`` (``embedding.context_source``): ``natural`` makes every
    group one real passage in ``group`` renamed copies (:func:`_natural_groups`), ``both`` half of each length's
    groups. ``haystacks`` (``embedding.context_haystacks``): the texts template documents are cut from, in turn
    (None: the recipe's novels). None for none."""
    if not rows:
        return None
    groups = rows // group
    per_length = [groups // len(lengths) + (i < groups % len(lengths)) for i in range(len(lengths))]
    rng = random.Random(f"posswap-context-pairs-{seed}")
    templates = training_templates(haystacks)
    built = []
    for at, (length, count) in enumerate(zip(lengths, per_length)):
        natural = {"templates": 0, "natural": count, "both": count // 2}[source]
        if natural:
            built += _natural_groups(tokenizer, length, natural, group, (seed * 100 + at) * 1000, chunk_tokens)
        count -= natural
        for part in range(0, count, len(KINDS)):  # one task (its own subjects): `group` documents of each kind
            task_seed = (seed * 100 + at) * 1000 + part
            kinds = min(len(KINDS), count - part)
            built += _groups(tokenizer, rng, templates, length, kinds, group, task_seed, chunk_tokens)
    rng.shuffle(built)
    flat = [row for rows_of_group in built for row in rows_of_group]
    width = max(len(label) for _, _, label in flat)
    return datasets.Dataset.from_dict(
        {
            "query": [q for q, _, _ in flat],
            "document": [d for _, d, _ in flat],
            "label": [label + [-1] * (width - len(label)) for _, _, label in flat],
        },
        info=datasets.DatasetInfo(description=GROUPED),
    )


def _groups(
    tokenizer, rng, templates: Templates, length: int, kinds: int, group: int, seed: int, chunk_tokens: int
) -> list[list[tuple]]:
    """``kinds`` groups (one per kind, in turn): the documents of a task whose kinds each ask two questions (drawn
    from the recipe's), one of them asked of all ``group`` documents of the kind."""
    asked = {kind: tuple(rng.sample(templates.relations[kind], 2)) for kind in KINDS}
    templates = dataclasses.replace(templates, relations=asked)
    task = build_context_task(tokenizer, length, len(KINDS) * group, seed, chunk_tokens, templates)
    groups = []
    for k, kind in enumerate(KINDS[:kinds]):
        relation = rng.choice(asked[kind])[0]
        rows = []
        for d in range(k, len(task.chunks), len(KINDS)):
            query = next(q for q in task.queries if q.document == d and q.relation == relation)
            spans = _spans(tokenizer, task.chunks[d])
            rows.append((query.query, task.documents[d], [query.chunk, len(task.chunks[d]), -1] + spans))
        groups.append(rows)
    return groups


def _natural_groups(tokenizer, length: int, groups: int, group: int, seed: int, chunk_tokens: int) -> list[list]:
    """``groups`` groups of ``group`` rows (an even number): each ``group // 2`` passages of the recipe's novels in
    their two copies (two people's invented names swapped), a fact chunk of each asked once a name, each name's
    question answered by its own copy: a group holds both copies of every passage in it, each the other's hard
    negative, told apart only by whom the chunk's pronouns mean (:mod:`posswap.embeddings.natural_context`)."""
    passages = groups * (group // 2)
    task = build_natural_task(tokenizer, length, 2 * passages, seed, chunk_tokens, NATURAL_TRAINING, facts=1)
    rows = [
        (
            q.query,
            task.documents[q.document],
            [q.chunk, len(task.chunks[q.document]), (i % group) ^ 1] + _spans(tokenizer, task.chunks[q.document]),
        )
        for i, q in enumerate(task.queries)  # per passage, its one fact's two questions, one per copy: rows 2k, 2k + 1
    ]
    return [rows[g * group : (g + 1) * group] for g in range(groups)]


def _spans(tokenizer, pieces: list[str]) -> list[int]:
    """Each piece's [start, end) in the tokens of the joined text (special tokens not counted), flattened."""
    spans, at = [], 0
    for piece in pieces:
        count = len(tokenizer(piece, add_special_tokens=False, verbose=False)["input_ids"])
        spans += [at, at + count]
        at += count
    return spans


class ContextChunkLoss(nn.Module):
    """Cross-entropy of ``scale`` x cosine between each question and every chunk of every document of the batch,
    each chunk its tokens' mean output in its whole document (after the modules past the pooling).

    ``copy_margin`` (``embedding.context_copy_margin``), for a natural passage's rows: its other copy's fact chunk,
    the same words, leaves the ranking and enters as ``scale`` x max(0, margin - (own - other copy's cosine)). As
    one more negative, the copy is pushed away as far as the cross-entropy can, and since the question quotes the
    chunk, that push is likely most of what a natural row teaches: the chunk learns to carry its name over what it
    says (issue 63: natural-only batches lost the needle and passkey; the margin runs kept them). The margin asks
    only that the copies be told apart (InSeNT, Conti et al. 2025, weighs its in-sequence negatives against the
    in-batch ones for the same reason)."""

    def __init__(self, model: nn.Module, scale: float = 20.0, copy_margin: float | None = None):
        super().__init__()
        self.model, self.scale, self.copy_margin = model, scale, copy_margin
        self.pooling_at = mean_pooling_index(model, "embedding.context_pairs")
        self.before = model.tokenizer.num_special_tokens_to_add(pair=False) // 2  # [CLS] ahead, as piece_means

    def forward(self, sentence_features, labels: torch.Tensor) -> torch.Tensor:
        queries = self.model(sentence_features[0])["sentence_embedding"]
        chunks, gold = [], []
        for outputs, label in zip(self._each_document(sentence_features[1]), labels.long()):
            count = int(label[1])
            spans = label[SPANS_AT : SPANS_AT + 2 * count].view(count, 2) + self.before
            gold.append(sum(len(c) for c in chunks) + int(label[0]))
            pooled = torch.stack([outputs[a:b].mean(dim=0) for a, b in spans.tolist()])
            chunks.append(after_pooling(self.model, self.pooling_at, pooled))
        scores = F.normalize(queries, dim=-1) @ F.normalize(torch.cat(chunks), dim=-1).T
        gold = torch.tensor(gold, device=scores.device)
        if self.copy_margin is None:
            return F.cross_entropy(self.scale * scores, gold)
        return self._with_copy_margin(scores, gold, labels[:, COPY_AT].long().to(scores.device))

    def _with_copy_margin(self, scores: torch.Tensor, gold: torch.Tensor, twins: torch.Tensor) -> torch.Tensor:
        """The ranking without each row's other copy, plus the hinge on the gap to it (rows without one: the
        ranking alone)."""
        rows = torch.arange(len(gold), device=scores.device)
        has = twins >= 0
        other = gold[twins.clamp(min=0)]  # the other copy's fact chunk (the same chunk of the twin document)
        logits = (self.scale * scores).masked_fill(
            F.one_hot(other, scores.shape[1]).bool() & has[:, None], float("-inf")
        )
        gap = scores[rows, gold] - scores[rows, other]
        hinge = torch.where(has, self.scale * F.relu(self.copy_margin - gap), torch.zeros_like(gap))
        return (F.cross_entropy(logits, gold, reduction="none") + hinge).mean()

    def _each_document(self, features: dict) -> list[torch.Tensor]:
        """Each document's token outputs, read alone without its padding (documents of 512 and 2048 tokens share
        batches: padding would cost as much as the text)."""
        outputs = []
        for row, keep in enumerate(features["attention_mask"].sum(dim=1).tolist()):
            one = {k: v[row : row + 1, :keep] for k, v in features.items() if torch.is_tensor(v) and v.dim() == 2}
            outputs.append(self.model(one)["token_embeddings"][0])
        return outputs


def check_context_pairs(model: Any, rows: int) -> None:
    if rows:
        mean_pooling_index(model, "embedding.context_pairs")
