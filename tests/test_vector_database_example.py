"""examples/late_chunk_index.py end to end (issue 49): a folder of long documents indexed with late chunks in
LanceDB, then searched: every row is a slice of its file, and a question finds the chunk that holds its answer.
Issue 62: the example as the README runs it, on its own documents: each hit printed whole with what its score means,
and the trained model's first hit the chunk that holds the fact (skipped without that model)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import posswap
from posswap.data import read_document

pytest.importorskip("lancedb")
st = pytest.importorskip("sentence_transformers")
sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
from late_chunk_index import index_folder, search  # noqa: E402


def test_a_folder_is_indexed_and_searched_with_each_chunks_text_and_document(tmp_path, minilm_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    persuasion, emma = read_document("persuasion"), read_document("emma")
    (folder / "a.txt").write_text(persuasion[40_000:44_000] + "\n\nThe lighthouse keeper kept bees on the cliff.\n\n")
    (folder / "b.txt").write_text(emma[10_000:13_000])
    (folder / "notes.md").write_text("not indexed")
    model = posswap.patch(st.SentenceTransformer(minilm_path, device="cpu"), posswap.InterpolateConfig(1024, "stride"))
    rows = index_folder(model, folder, tmp_path / "db", max_tokens=128)
    expected = sum(len(posswap.split_text(model, (folder / n).read_text(), 128)) for n in ("a.txt", "b.txt"))
    assert rows == expected
    hits = search(model, tmp_path / "db", "Who kept bees on the cliff?", k=3)
    assert len(hits) == 3 and hits[0]["document"] == "a.txt" and "kept bees" in hits[0]["text"]
    for hit in hits:  # each stored text is its file's own characters at its span
        assert (folder / hit["document"]).read_text()[hit["start"] : hit["end"]] == hit["text"]
    assert hits[0]["_distance"] <= hits[1]["_distance"] <= hits[2]["_distance"]
    with pytest.raises(ValueError, match="holds no .txt file"):
        index_folder(model, tmp_path / "db", tmp_path / "db2")


# -- issue 62: the example as a user runs it, on its own documents ---------------------------------------------------

EXAMPLE = Path(__file__).parents[1] / "examples"
DOCUMENTS = EXAMPLE / "documents"
QUESTION = "What pet does Wren Okafor keep?"
# The trained model the README points at (posswap train minilm-late-2k), or another folder of it.
LATE_MODEL = Path(os.environ.get("POSSWAP_LATE_MODEL", Path(__file__).parents[1] / "out" / "minilm-late-2k" / "model"))


def run_example(model: str, db: Path, capsys) -> tuple[str, list[dict]]:
    """``index`` then ``search`` as the README runs them: what ``search`` printed, and the hits it found."""
    import late_chunk_index

    assert late_chunk_index.main(["index", model, str(DOCUMENTS), str(db)]) == 0
    assert late_chunk_index.main(["search", model, str(db), QUESTION]) == 0
    printed = capsys.readouterr().out
    return printed, search(posswap.from_pretrained(model), db, QUESTION)


def the_chunk_naming(hit: dict, words: str) -> bool:
    return hit["document"] == "wren-okafor.txt" and words in hit["text"]


def test_the_example_prints_each_hit_whole_with_what_its_score_means(tmp_path, capsys, minilm_path):
    printed, hits = run_example(minilm_path, tmp_path / "db", capsys)
    assert "cosine similarity to the question" in printed and "higher is nearer" in printed
    for rank, hit in enumerate(hits, 1):
        whole = (DOCUMENTS / hit["document"]).read_text()[hit["start"] : hit["end"]]
        assert " ".join(whole.split()) in " ".join(printed.split()), f"hit {rank} is not printed whole"
        assert f"{rank}. {hit['similarity']:.3f}  {hit['document']}" in printed
        assert abs(hit["similarity"] - (1 - hit["_distance"])) < 1e-9
    assert hits[0]["similarity"] >= hits[1]["similarity"] >= hits[2]["similarity"]
    # What the docs say of the stock model: the chunk that names Wren Okafor comes first, not the tortoise's.
    assert the_chunk_naming(hits[0], "Wren Okafor") and "tortoise" not in hits[0]["text"]


def test_the_trained_models_first_hit_is_the_chunk_that_holds_the_fact(tmp_path, capsys):
    if not (LATE_MODEL / "config.json").is_file():
        pytest.skip(f"no {LATE_MODEL}: train it with posswap train minilm-late-2k (or set POSSWAP_LATE_MODEL)")
    printed, hits = run_example(str(LATE_MODEL), tmp_path / "db", capsys)
    assert the_chunk_naming(hits[0], "tortoise") and "Wren" not in hits[0]["text"], printed
