"""``posswap demo``: the embedded default job. Patch the real all-MiniLM-L6-v2 (BERT, 512 positions) with
each interpolate mode and show, on held-out Austen text, that it now reads ``max_length`` tokens, that
``copy`` leaves 512-token outputs as they were, and what the patch costs in speed."""

from __future__ import annotations

import time

import torch
from transformers import AutoConfig, AutoModel, AutoTokenizer

from .data import read_document
from .loading import minilm_path
from .methods.interpolate import InterpolateConfig
from .patching import patch
from .portable.posswap_functional import RESAMPLE_MODES


def _seconds(model, ids: torch.Tensor, repeats: int = 3) -> float:
    """Best of ``repeats`` timed forwards after one warm-up (the first call pays for allocation)."""
    model(input_ids=ids)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        model(input_ids=ids)
        best = min(best, time.perf_counter() - start)
    return best


@torch.inference_mode()
def run_demo(max_length: int = 2048) -> None:
    path = minilm_path()
    original = AutoConfig.from_pretrained(path).max_position_embeddings
    if max_length < original:
        raise ValueError(
            f"--max-length {max_length} is below MiniLM's own {original} tokens: the demo shows it reading further; "
            f"give --max-length {original} or more."
        )
    tokenizer = AutoTokenizer.from_pretrained(path)
    stock = AutoModel.from_pretrained(path).eval()
    text = read_document("persuasion")
    ids = tokenizer(text[: max_length * 8], add_special_tokens=False, return_tensors="pt", verbose=False).input_ids[
        :, :max_length
    ]
    if ids.shape[1] < max_length:
        raise ValueError(f"The demo text has only {ids.shape[1]} tokens; choose --max-length <= {ids.shape[1]}.")
    short = ids[:, :original]
    stock_short = stock(input_ids=short).last_hidden_state
    try:
        stock(input_ids=ids)
        stock_reads = "yes"
    except (IndexError, RuntimeError) as error:  # what stock BERT raises past its table
        stock_reads = f"no ({type(error).__name__}: {str(error).splitlines()[0][:70]}...)"
    stock_time = _seconds(stock, short)

    print(f"all-MiniLM-L6-v2: {original} positions. Reads {max_length} tokens unpatched? {stock_reads}")
    print(
        f"{'mode':<8}{'reads ' + str(max_length):>12}{'max |diff| @' + str(original):>18}{'time @' + str(original) + ' vs stock':>22}{'time @' + str(max_length):>14}"
    )
    for mode in RESAMPLE_MODES:
        model = AutoModel.from_pretrained(path).eval()
        patch(model, InterpolateConfig(max_length=max_length, mode=mode), tokenizer=tokenizer)
        long_out = model(input_ids=ids).last_hidden_state
        diff = (model(input_ids=short).last_hidden_state - stock_short).abs().max().item()
        ratio = _seconds(model, short) / stock_time
        print(
            f"{mode:<8}{'yes' if torch.isfinite(long_out).all() else 'NaN':>12}{diff:>18.2e}"
            f"{ratio:>21.2f}x{_seconds(model, ids, repeats=1):>13.2f}s"
        )
    print(f"tokenizer.model_max_length is now {tokenizer.model_max_length}.")
    print("copy keeps every old position vector (diff 0); linear/cubic spread the old table over the new length,")
    print("so 512-token outputs move until the model is trained further at the new length (posswap train).")
