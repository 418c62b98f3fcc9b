"""Which way of keeping a long document finds it most often, computed from the figures: one rule for every verdict
posswap prints or writes (``posswap demo``, the README and the docs' tables).

At each length the ways are ranked cheapest first (one vector per document, then a vector per chunk); the verdict
is the cheapest way within one standard error of the best (the best's error). A part of a verdict reads
``LENGTH: WAY FIGURE (COLUMN)``; where the cheaper way won within the error, the best follows
(``...; best WAY FIGURE ± ERROR``), so a reader (and ``tests/test_verdicts.py``) can hold every verdict against
every table on its page.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Pick:
    """One length's verdict: the way that wins and its column, and the best way with its figure's error."""

    length: int
    way: str
    column: str
    value: float
    best_way: str
    best_value: float
    best_error: float

    def text(self, column: bool = True) -> str:
        """``512: one vector 0.94 (COLUMN)``, with ``; best WAY FIGURE ± ERROR`` when the cheaper way won."""
        notes = [self.column] if column else []
        if self.best_way != self.way or self.best_value != self.value:
            notes.append(f"best {self.best_way} {self.best_value:.2f} ± {self.best_error:.2f}")
        return f"{self.length}: {self.way} {self.value:.2f}" + (f" ({'; '.join(notes)})" if notes else "")


def pick(lengths: list[int], ways: dict[str, list[tuple[str, list[float], list[float]]]]) -> list[Pick]:
    """Per length, the cheapest way within one standard error of the best. ``ways``: way -> its columns as
    (name, accuracy per length, standard error per length), the ways cheapest first; a way scores its best column."""
    out = []
    for i, length in enumerate(lengths):
        best_of = {way: max(columns, key=lambda c: c[1][i]) for way, columns in ways.items() if columns}
        top_way = max(best_of, key=lambda w: best_of[w][1][i])
        top = best_of[top_way]
        floor = top[1][i] - top[2][i]
        way = next(w for w, c in best_of.items() if c[1][i] >= floor)
        name, accuracy, _ = best_of[way]
        out.append(Pick(length, way, name, accuracy[i], top_way, top[1][i], top[2][i]))
    return out


def kinds(models: dict[str, dict]) -> dict[str, list[tuple[str, list[float], list[float]]]]:
    """A results file's columns by way: ``one vector`` (a model's own column), ``chunks`` (a stock model's
    ``chunk-max@N``) and ``late chunks`` (``late-chunk-max@N``); chunk-mean keeps one vector but is not a model's."""
    columns = {
        "one vector": [n for n in models if "@" not in n],
        "chunks": [n for n in models if " chunk-max@" in n and "late-chunk" not in n],
        "late chunks": [n for n in models if "late-chunk-max@" in n],
    }
    return {way: [(n, models[n]["accuracy"], models[n]["stderr"]) for n in names] for way, names in columns.items()}


def best_per_length(results: dict, scope: str) -> str:
    """One line: which way of keeping a long document finds it most often at each length (``scope``: what the
    figures cover, after the task)."""
    picks = pick(results["lengths"], kinds(results["models"]))
    return (
        f"Best per length ({results['task']}, {scope}; within one standard error of the best, the fewest vectors): "
        + "; ".join(p.text() for p in picks)
        + "."
    )


def demo_columns(results, name: str) -> dict[str, str]:
    """The ways of the demo's table, cheapest first, as its columns: one ``name`` vector, one stock vector (the stock
    model truncating), the stock model's chunks (a vector per chunk, a document scores its best), ``name``'s late
    chunks."""
    chunk = results.models["stock"].limit
    columns = {
        f"one {name} vector": name,
        "one stock vector": "stock",
        "the stock model's chunks": f"stock chunk-max@{chunk}",
        f"the {name} model's late chunks": f"{name} late-chunk-max@{chunk}",
    }
    return {label: column for label, column in columns.items() if column in results.models}


def demo_picks(results, name: str) -> list[Pick]:
    columns, models = demo_columns(results, name), results.models
    ways = {label: [(c, models[c].accuracy, models[c].stderr)] for label, c in columns.items()}
    return pick(results.lengths, ways)


def demo_model(steps: int | None) -> str:
    """What the demo's verdict is about: its own briefly trained model, not the shipped recipe's."""
    return f"the demo's {steps}-step model" if steps else "the demo's patched model, untrained"


def verdict(results, name: str | None = None, about: str | None = None) -> str:
    """The demo's verdict from its figures: per length which way wins (:func:`pick`), what to do at the longest
    length, and where the shipped recipes' figures are. ``name``: the one vector's column (default: trained, else
    patched); ``about``: the model it is about (:func:`demo_model`)."""
    name = name or ("trained" if "trained" in results.models else "patched")
    picks = demo_picks(results, name)
    where = haystack_name(results.settings.get("haystack", "filler"))
    about = about or f"the demo's {name} model"
    return (
        f"Verdict on {about} ({results.task}, the needle in {where}; at each length the way with the fewest vectors "
        f"within one standard error of the best): {'; '.join(p.text(column=False) for p in picks)}. "
        f"{_advice(results, name, picks[-1].way)} The shipped recipes, trained in full (minilm-embed-2k, "
        "minilm-late-2k), are judged on every committed run in the README's long-document verdicts."
    )


def haystack_name(haystack: str) -> str:
    return "synthetic filler" if haystack == "filler" else f"{haystack.capitalize()} prose"


def _advice(results, name: str, winner: str) -> str:
    """What to do with documents of the longest length, with this model, from the way that won there."""
    columns, models = demo_columns(results, name), results.models
    length, chunk = results.lengths[-1], models["stock"].limit
    at = {label: models[column].accuracy[-1] for label, column in columns.items()}
    others = ", ".join(f"{label} {value:.2f}" for label, value in at.items() if label != winner)
    if winner.startswith("one "):
        return f"At {length} tokens {winner} per document is enough: it finds {at[winner]:.2f}, {others}."
    return f"At {length} tokens keep {winner}, a vector per {chunk}-token chunk: they find {at[winner]:.2f}, {others}."


def context_line(context, name: str) -> str:
    """One line from the context task, from its figures: among the chunks that answer a question (one per document
    of that kind), do ``name``'s late chunks find the subject's above chance, and more often than the stock model's
    chunks, beyond one standard error?"""
    late, alone = context.rows[f"{name} late chunks"], context.rows["stock chunks"]
    chance = context.settings["chance"]["fact_accuracy"][0]
    found, error = late.fact_accuracy[0], late.fact_stderr[0]
    gap, both = found - alone.fact_accuracy[0], (error**2 + alone.fact_stderr[0] ** 2) ** 0.5
    if found - error <= chance:
        finding = (
            f"the {name} model's late chunks do not find it above chance (minilm-late-2k is the recipe that trains "
            "for it)"
        )
    elif gap > both:
        finding = f"the {name} model's late chunks find it above chance and more often than the stock model's chunks"
    else:
        finding = (
            f"the {name} model's late chunks find it above chance, within a standard error of the stock model's chunks"
        )
    return (
        f"A fact whose chunk does not name its subject ({len(late.fact_hits[0])} questions in {context.documents} "
        f"documents of {context.lengths[0]} tokens, chunks of {context.chunk_tokens}): {finding}. Among the chunks "
        f"that answer its question, the subject's found {found:.2f} ± {error:.2f} by late chunks, "
        f"{alone.fact_accuracy[0]:.2f} ± {alone.fact_stderr[0]:.2f} by the stock model's chunks (chance {chance:.2f})."
    )
