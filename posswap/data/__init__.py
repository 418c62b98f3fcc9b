"""Files shipped inside the package: the public-domain corpus and the GPT-2 tokenizer."""

from __future__ import annotations

import gzip
from importlib import resources
from pathlib import Path

DATA_DIR = Path(str(resources.files(__name__)))
CORPUS_DIR = DATA_DIR / "corpus"
GPT2_TOKENIZER_DIR = DATA_DIR / "tokenizers" / "gpt2"


def corpus_files() -> dict[str, Path]:
    """Document name ('persuasion', 'kjv', ...) -> its .txt.gz file."""
    return {path.name.removesuffix(".txt.gz"): path for path in sorted(CORPUS_DIR.rglob("*.txt.gz"))}


def read_document(name: str) -> str:
    files = corpus_files()
    if name not in files:
        raise ValueError(f"No embedded document {name!r}; the corpus has: {', '.join(files)}.")
    with gzip.open(files[name], "rt", encoding="utf-8") as f:
        return f.read()
