"""The ``embedding:`` block of a recipe: train a sentence-transformers model at its new length with
sentence-transformers' own trainer and losses (:mod:`posswap.embeddings.training.trainer`). Checked with the rest of the
recipe, before anything is loaded; keys of ``train:`` / ``data:`` / ``eval:`` that only the MLM/CLM loop uses are
refused here rather than silently ignored."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ...config import check_bool, check_choice, check_number, check_positive_int, shown
from ...data import corpus_files
from ..context_task import HAYSTACKS

LOSSES = ("cached_mnrl", "mnrl")
CONTEXT_SOURCES = ("templates", "natural", "both")


@dataclass
class EmbeddingSpec:
    document_lengths: list[int] = field(
        default_factory=lambda: [512],
        metadata={
            "help": "Token lengths of the documents cut from data.train, used in turn (repeat one to weight it)."
        },
    )
    pairs: int = field(default=256, metadata={"help": "(passage, document) pairs in the training set."})
    anchor_words: int = field(default=24, metadata={"help": "Words in the passage drawn from each document."})
    hard_negatives: bool = field(
        default=False,
        metadata={
            "help": "Pair each document with a hard negative: the same document with its passage replaced by words "
            "from elsewhere, so only that passage tells them apart (twice the documents per step)."
        },
    )
    loss: str = field(
        default="cached_mnrl",
        metadata={
            "help": "cached_mnrl (GradCache: a big batch of in-batch negatives, a few documents at a time) or mnrl."
        },
    )
    mini_batch_size: int = field(default=1, metadata={"help": "cached_mnrl: texts embedded per pass."})
    scale: float = field(default=20.0, metadata={"help": "Inverse temperature of the ranking loss (MNRL's scale)."})
    dropout: float | None = field(
        default=None,
        metadata={
            "help": "Dropout while training (null: the model's own). 0 is ~4x faster on CPU, where attention with "
            "dropout keeps every attention weight: minilm-late-2k (8 documents of up to 2048 tokens a batch) with 0.1 "
            "was killed at 24 GB in its first step."
        },
    )
    teacher: int = field(
        default=0,
        metadata={
            "help": "Texts the model read whole before its patch (passages and documents of its old limit), each "
            "with its embedding then, trained with 1 - cosine beside the pairs: keeps what it gave there. 0: none."
        },
    )
    chunk_teacher: int = field(
        default=0,
        metadata={
            "help": "Documents of the longest length, cut into pieces of the model's old limit, each with its "
            "embedding before the patch: the model's token outputs over each piece, in the whole document, are "
            "trained with 1 - cosine to it (late chunks read as the pieces were read alone). 0: none."
        },
    )
    context_pairs: int = field(
        default=0,
        metadata={
            "help": "Documents of the training text with an invented subject named in one chunk and facts about it "
            "in later chunks that do not name it, each with a question naming the subject: the fact's chunk, pooled "
            "in the whole document, is ranked first among every chunk of the batch (late chunks that carry their "
            "document's context). The recipe's own templates; the context-retrieval task's are never trained on. "
            "0: none."
        },
    )
    context_lengths: list[int] | None = field(
        default=None,
        metadata={"help": "Token lengths of the context_pairs documents, in turn (null: embedding.document_lengths)."},
    )
    context_chunk_tokens: int = field(
        default=128,
        metadata={"help": "The most tokens a chunk of a context_pairs document holds, special tokens counted."},
    )
    context_source: str = field(
        default="templates",
        metadata={
            "help": "What the context_pairs documents are: templates (an invented subject named in one chunk, facts "
            "about it in later chunks: the recipe's own templates), natural (real passages of the training novels, each in "
            "two copies with two people's invented names swapped, asked about a chunk that names nobody by the name its "
            "subject has in each: only whom the pronouns mean tells the copies apart; train.batch_size even) or both "
            "(half of each length's batches each)."
        },
    )
    context_haystacks: list[str] | None = field(
        default=None,
        metadata={
            "help": "Template context_pairs only: the embedded texts their documents are cut from, in turn (repeat one "
            "to weight it; an odd count crosses them with the four kinds of subject). null: the five novels of the "
            "training split. Never persuasion or python-docs, the context task's held-out haystacks."
        },
    )
    context_copy_margin: float | None = field(
        default=None,
        metadata={
            "help": "Natural context pairs only: how much closer (in cosine) a question must be to its own copy's "
            "chunk than to the other copy's, the same words. null: the other copy is one more negative of the "
            "ranking, pushed away as far as the loss can. A number: the ranking leaves the other copy out and a "
            "hinge asks for this margin and no more (the copies' identical words keep what they say)."
        },
    )

    soup: int = field(
        default=1,
        metadata={
            "help": "Runs trained from the same start with seeds train.seed, train.seed + 1, ..., and saved as one "
            "model with their weights averaged (a uniform model soup, Wortsman et al. 2022). 1: one run."
        },
    )

    def validate(self, max_length: int | None) -> None:
        check_positive_int("embedding.anchor_words", self.anchor_words)  # the lengths are checked against it
        if not isinstance(self.document_lengths, list) or not self.document_lengths:
            raise ValueError(
                f"embedding.document_lengths must be a non-empty list of token lengths, got {shown(self.document_lengths)}."
            )
        for length in self.document_lengths:
            check_positive_int("embedding.document_lengths entries", length)
            if length < 2 * self.anchor_words:
                raise ValueError(
                    f"embedding.document_lengths entry {length} is shorter than twice embedding.anchor_words "
                    f"({self.anchor_words}): a document must be more than its passage."
                )
            if max_length is not None and length > max_length:
                raise ValueError(
                    f"embedding.document_lengths entry {length} is longer than posswap.max_length ({max_length})."
                )
        check_bool("embedding.hard_negatives", self.hard_negatives)
        check_positive_int("embedding.pairs", self.pairs)
        check_choice("embedding.loss", self.loss, LOSSES)
        check_positive_int("embedding.mini_batch_size", self.mini_batch_size)
        if self.loss == "mnrl" and self.mini_batch_size != EmbeddingSpec.mini_batch_size:  # read by cached_mnrl only
            raise ValueError(
                f"embedding.mini_batch_size ({self.mini_batch_size}) applies to loss cached_mnrl only; mnrl embeds "
                "the whole batch at once: remove it or use loss cached_mnrl."
            )
        check_number("embedding.scale", self.scale, above=0)
        if self.dropout is not None:
            check_number("embedding.dropout", self.dropout, minimum=0, below=1)
        check_positive_int("embedding.soup", self.soup)
        for name in ("teacher", "chunk_teacher", "context_pairs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"embedding.{name} must be a whole number of texts >= 0 (0: none), got {shown(value)}."
                )
        self._validate_context(max_length)

    def _validate_context(self, max_length: int | None) -> None:
        check_positive_int("embedding.context_chunk_tokens", self.context_chunk_tokens)
        check_choice("embedding.context_source", self.context_source, CONTEXT_SOURCES)
        if self.context_source != "templates" and not self.context_pairs:
            raise ValueError(
                f"embedding.context_source ({self.context_source}) says what the context pairs are, and "
                "embedding.context_pairs is 0: set embedding.context_pairs, or remove embedding.context_source."
            )
        if self.context_haystacks is not None:
            check_context_haystacks(self.context_haystacks, self.context_source, self.context_pairs)
        if self.context_copy_margin is not None:
            check_number("embedding.context_copy_margin", self.context_copy_margin, above=0, maximum=2)
            if self.context_source == "templates":
                raise ValueError(
                    f"embedding.context_copy_margin ({self.context_copy_margin}) applies to natural context pairs "
                    "and embedding.context_source is templates: set context_source natural or both, or remove it."
                )
        if self.context_lengths is None:
            if self.context_pairs and max(self.document_lengths) < 3 * self.context_chunk_tokens:
                raise ValueError(
                    f"embedding.context_pairs: no entry of embedding.document_lengths holds three chunks of "
                    f"embedding.context_chunk_tokens ({self.context_chunk_tokens}); give embedding.context_lengths."
                )
            return
        if not isinstance(self.context_lengths, list) or not self.context_lengths:
            raise ValueError(
                f"embedding.context_lengths must be a non-empty list of token lengths or null, got "
                f"{shown(self.context_lengths)}."
            )
        for length in self.context_lengths:
            check_positive_int("embedding.context_lengths entries", length)
            if length < 3 * self.context_chunk_tokens:
                raise ValueError(
                    f"embedding.context_lengths entry {length} holds fewer than three chunks of "
                    f"embedding.context_chunk_tokens ({self.context_chunk_tokens}): the subject's and two facts'."
                )
            if max_length is not None and length > max_length:
                raise ValueError(
                    f"embedding.context_lengths entry {length} is longer than posswap.max_length ({max_length})."
                )

    def context_document_lengths(self) -> list[int]:
        """The lengths of the context_pairs documents: context_lengths, else those of document_lengths that hold
        three chunks."""
        if self.context_lengths is not None:
            return self.context_lengths
        return [n for n in self.document_lengths if n >= 3 * self.context_chunk_tokens] or [max(self.document_lengths)]


def check_context_haystacks(haystacks: Any, source: str, pairs: int) -> None:
    """A non-empty list of embedded texts the context task does not hold out, for template documents."""
    if not pairs:
        raise ValueError(
            "embedding.context_haystacks says what the context pairs are cut from, and embedding.context_pairs is 0: "
            "set embedding.context_pairs, or remove embedding.context_haystacks."
        )
    if not isinstance(haystacks, list) or not haystacks or not all(isinstance(h, str) for h in haystacks):
        raise ValueError(
            f"embedding.context_haystacks must be a non-empty list of embedded text names or null, got {shown(haystacks)}."
        )
    if source == "natural":
        raise ValueError(
            "embedding.context_haystacks applies to template context pairs and embedding.context_source is natural "
            "(renamed novel passages): set context_source templates or both, or remove it."
        )
    known = corpus_files()
    for name in haystacks:
        if name in HAYSTACKS:
            raise ValueError(
                f"embedding.context_haystacks entry {name!r} is a haystack the context task holds out for the "
                f"evaluation ({', '.join(HAYSTACKS)}): train on another text."
            )
        if name not in known:
            raise ValueError(
                f"embedding.context_haystacks entry {name!r} is not an embedded text; choose from: "
                f"{', '.join(n for n in known if n not in HAYSTACKS)}."
            )


def check_embedding_recipe(recipe: Any, defaults: Any) -> None:
    """Keys outside ``embedding:`` that an embedding run cannot honour: an error naming the key, not a key that
    is read and then ignored. ``defaults`` is a fresh ``Recipe`` (its blocks hold the default values)."""
    t, d = recipe.train, defaults.train
    unused = ("pose_window", "curriculum", "mlm_probability", "save_every", "keep_checkpoints", "lora")
    for name in unused:
        if getattr(t, name) != getattr(d, name):
            raise ValueError(
                f"train.{name} is not used by an embedding recipe (sentence-transformers' trainer, no checkpoints); "
                "remove it."
            )
    check_choice("train.trainable (embedding recipe)", t.trainable, ("full", "positions"))
    if t.distill != d.distill:
        raise ValueError(
            "train.distill is for the MLM/CLM loop; an embedding recipe keeps what the unpatched model gave with "
            "embedding.teacher (texts it embedded, trained with 1 - cosine): remove train.distill and use that."
        )
    if recipe.embedding.pairs < t.batch_size * t.grad_accum:  # the trainer drops a short last batch: no step at all
        raise ValueError(
            f"embedding.pairs ({recipe.embedding.pairs}) is fewer than one optimizer step takes (train.batch_size x "
            f"train.grad_accum = {t.batch_size * t.grad_accum}); raise embedding.pairs."
        )
    for name in ("teacher", "chunk_teacher"):
        if getattr(recipe.embedding, name) and recipe.posswap is None:
            raise ValueError(
                f"embedding.{name} needs a posswap: block: the teacher is the model before the recipe patches it, "
                "and without a patch it would be the model itself."
            )
    if t.batch_size < 2 and not recipe.embedding.hard_negatives:  # one document, no negative: the loss is 0
        raise ValueError(
            f"train.batch_size ({t.batch_size}) must be at least 2 for an embedding recipe: the ranking loss's "
            "negatives are the other documents of the batch, and with one the loss is 0 and nothing trains "
            "(or set embedding.hard_negatives: true)."
        )
    if recipe.embedding.context_pairs and recipe.embedding.context_source != "templates" and t.batch_size % 2:
        raise ValueError(
            f"train.batch_size ({t.batch_size}) must be even with embedding.context_source "
            f"{recipe.embedding.context_source}: a batch holds both copies of each natural passage."
        )
    check_choice("train.mixed_precision (embedding recipe)", t.mixed_precision, ("no",))
    if recipe.tokenizer is not None:
        raise ValueError(
            "tokenizer: an embedding recipe uses the sentence-transformers model's own tokenizer; remove it."
        )
    for name in ("repeat_fraction", "repeat_span", "streaming"):
        if getattr(recipe.data, name) != getattr(defaults.data, name):
            raise ValueError(f"data.{name} is not used by an embedding recipe; remove it.")
    changed = [f.name for f in fields(recipe.eval) if getattr(recipe.eval, f.name) != getattr(defaults.eval, f.name)]
    if changed:
        raise ValueError(
            f"eval.{changed[0]}: the eval block runs the MLM/CLM harness, which does not apply to an embedding "
            "recipe; remove it and evaluate with posswap.embeddings.retrieval."
        )
