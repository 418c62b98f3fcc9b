"""The real pretrained BERT (all-MiniLM-L6-v2, 512 positions) patched to 2048 with each mode."""

from __future__ import annotations

import pytest
import torch
import transformers

import posswap
from posswap.data import read_document

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def minilm(minilm_path):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path)
    text = read_document("persuasion")[:20000]
    ids = tokenizer(text, return_tensors="pt", verbose=False).input_ids[:, :2048]
    stock = transformers.AutoModel.from_pretrained(minilm_path).eval()
    with torch.inference_mode():
        stock_512 = stock(input_ids=ids[:, :512]).last_hidden_state
    return minilm_path, ids, stock_512


@pytest.mark.parametrize("mode", ["copy", "linear", "cubic"])
def test_minilm_reads_2048(minilm, mode):
    path, ids, stock_512 = minilm
    assert ids.shape == (1, 2048)
    model = transformers.AutoModel.from_pretrained(path).eval()
    posswap.patch(model, posswap.InterpolateConfig(max_length=2048, mode=mode))
    with torch.inference_mode():
        long = model(input_ids=ids).last_hidden_state
        short = model(input_ids=ids[:, :512]).last_hidden_state
    assert long.shape == (1, 2048, 384) and torch.isfinite(long).all()
    if mode == "copy":
        torch.testing.assert_close(short, stock_512, atol=1e-6, rtol=0)
    else:
        # Resampling moves every position past 0, so 512-token outputs change.
        assert not torch.allclose(short, stock_512, atol=1e-3)
