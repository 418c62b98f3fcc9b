"""Index a folder of long documents with late chunks in LanceDB, then ask it questions.

Each document is cut at sentence and paragraph ends into pieces of at most ``--max-tokens`` tokens
(:func:`posswap.split_text`), and every piece gets its late-chunked vector: its tokens pooled while the model
reads the whole document (:func:`posswap.late_chunk_pieces`; a document longer than the model reads goes in
overlapping windows). LanceDB stores each piece with its text, its document and its character span, in-process,
in a folder. A search prints each hit's whole text with its score: the cosine similarity of the hit's vector to
the question's (1: the same direction; higher is nearer; LanceDB's ``_distance`` is 1 minus it).

LanceDB because it is a real vector database that runs in the process (no server), installs from PyPI with its
wheels (``pip install 'posswap[vectordb]'``) and keeps the text and metadata beside each vector in one table;
sqlite-vec needs an SQLite that loads extensions, which many Python builds do not have.

    posswap train minilm-late-2k                                    # the model: out/minilm-late-2k/model
    python examples/late_chunk_index.py index  out/minilm-late-2k/model examples/documents my-index
    python examples/late_chunk_index.py search out/minilm-late-2k/model my-index "What pet does Wren Okafor keep?"

``examples/documents`` holds three short made-up biographies, each naming its person once, in its first
paragraph, and telling facts about them later as "she" or "the baker": the chunk that holds a fact does not say
whose it is. Read alone, as the stock model's chunks are, the chunk that names the person wins; a late chunk knows
its document. Any folder of ``.txt`` files works the same way.

A mistake (LanceDB not installed, a model folder that does not exist, a folder with no .txt file) is one line on
stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

import posswap
from posswap.extras import MissingExtra, require

# LanceDB logs "No existing dataset ... it will be created" as a warning when the index is new: expected, not news.
os.environ.setdefault("LANCEDB_LOG", "error")

TABLE = "chunks"
SCORE = "cosine similarity to the question: 1 is the same direction, higher is nearer"


def index_folder(model, folder: str | Path, db: str | Path, max_tokens: int = 64) -> int:
    """Every ``.txt`` file of ``folder`` as late chunks in the LanceDB at ``db`` (a new table): the rows written."""
    import lancedb

    files = sorted(Path(folder).glob("*.txt"))
    if not files:
        raise ValueError(f"{folder} holds no .txt file to index.")
    texts = [path.read_text(encoding="utf-8") for path in files]
    pieces = posswap.late_chunk_pieces(model, texts, max_tokens=max_tokens, long_documents="windows")
    rows = [
        {
            "vector": chunk.vector.tolist(),
            "text": chunk.text,
            "document": path.name,
            "start": chunk.start,
            "end": chunk.end,
        }
        for path, chunks in zip(files, pieces)
        for chunk in chunks
    ]
    lancedb.connect(str(db)).create_table(TABLE, data=rows, mode="overwrite")
    return len(rows)


def search(model, db: str | Path, query: str, k: int = 3) -> list[dict]:
    """The ``k`` chunks nearest the query, nearest first, each with its text, document, span, LanceDB's cosine
    ``_distance`` and ``similarity`` (1 - distance: the cosine similarity, higher is nearer)."""
    import lancedb

    vector = model.encode([query])[0].tolist()
    table = lancedb.connect(str(db)).open_table(TABLE)
    hits = table.search(vector).metric("cosine").limit(k).to_list()
    keys = ("document", "start", "end", "text", "_distance")
    return [{**{key: hit[key] for key in keys}, "similarity": 1.0 - hit["_distance"]} for hit in hits]


def show(query: str, hits: list[dict]) -> str:
    """The hits as the example prints them: each one's score, document, span and whole text."""
    lines = [f"{len(hits)} chunks nearest {query!r}, nearest first (score: {SCORE}):"]
    for rank, hit in enumerate(hits, 1):
        lines.append(f"\n{rank}. {hit['similarity']:.3f}  {hit['document']}, characters {hit['start']}-{hit['end']}")
        text = " ".join(hit["text"].split())
        lines.append(textwrap.fill(text, 100, initial_indent="   ", subsequent_indent="   "))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="late_chunk_index.py", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    index = commands.add_parser("index", help="Index every .txt file of FOLDER into DB.")
    index.add_argument("model"), index.add_argument("folder"), index.add_argument("db")
    index.add_argument("--max-tokens", type=int, default=64, help="The most tokens a chunk holds (default 64).")
    ask = commands.add_parser("search", help="The chunks of DB nearest a question.")
    ask.add_argument("model"), ask.add_argument("db"), ask.add_argument("query")
    ask.add_argument("-k", type=int, default=3, help="How many chunks to show (default 3).")
    args = parser.parse_args(argv)
    try:
        run(args)
    except (MissingExtra, ValueError, OSError) as error:  # the user's to fix: one line, no traceback
        print(f"{parser.prog}: error: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


def run(args: argparse.Namespace) -> None:
    require("vectordb", "lancedb", needed_for="examples/late_chunk_index.py")  # before the model loads
    if args.model.startswith("out/minilm-late-2k") and not Path(args.model).exists():
        raise ValueError(f"{args.model} does not exist yet: train it with posswap train minilm-late-2k.")
    model = posswap.from_pretrained(args.model)
    if args.command == "index":
        print(f"{index_folder(model, args.folder, args.db, args.max_tokens)} chunks written to {args.db}")
        return
    print(show(args.query, search(model, args.db, args.query, args.k)))


if __name__ == "__main__":
    sys.exit(main())
