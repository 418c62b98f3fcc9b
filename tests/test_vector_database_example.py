"""examples/late_chunk_index.py end to end (issue 49): a folder of long documents indexed with late chunks in
LanceDB, then searched: every row is a slice of its file, and a question finds the chunk that holds its answer."""

from __future__ import annotations

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
