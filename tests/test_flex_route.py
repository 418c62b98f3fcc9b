"""``backend="flex"`` on CPU gives eager's output on every row, at every shape, on every x86 CPU (issue 60).

torch 2.13's compiled CPU flex kernel returned NaN for whole rows on an AVX2 CPU (AMD EPYC, no AVX-512) after a
recompile at a new shape: (2, 40) with a padded row NaN on its first call, (2, 24) and (2, 40) unpadded NaN later.
On CPU posswap's flex kernels now run SDPA with the same mask and bias (``portable/posswap_flex_route.py``). The
probe runs the issue's sequence of shapes and padding patterns in one process, every method with a kernel choice,
and compares every real token of every row with the same model patched with ``backend="eager"``. CI runs this file
a second time with ``ATEN_CPU_CAPABILITY=avx2`` (torch's AVX2 kernels on a machine with AVX-512).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import make_model, padded_mask, sharpen_qk, token_ids

import posswap
from posswap.portable import posswap_flex_route

LENGTH = 96
# (length, padded tokens of row 1), in this order, one process: the sequence, then longer than the old table.
SHAPES = [(40, 7), (40, 7), (24, 5), (40, 0), (33, 10), (64, 20), (96, 0)]
METHODS = {
    "alibi": lambda backend: posswap.AlibiConfig(max_length=LENGTH, backend=backend),
    "t5-bias": lambda backend: posswap.T5BiasConfig(max_length=LENGTH, init="fit", backend=backend),
    "tupe": lambda backend: posswap.TupeConfig(max_length=LENGTH, relative=True, backend=backend),
    "rope": lambda backend: posswap.RopeConfig(max_length=LENGTH, backend=backend),
}
MODELS = [("bert", "BertForSequenceClassification"), ("gpt2", "GPT2LMHeadModel")]


def kernels(model_type: str, head: str, method: str) -> dict:
    base = sharpen_qk(make_model(model_type, head))
    return {b: posswap.patch(copy.deepcopy(base), METHODS[method](b)).eval() for b in ("flex", "eager")}


def outputs(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    return out.logits if out.logits.dim() == 3 else out.logits[:, None]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("model_type,head", MODELS, ids=[head for _, head in MODELS])
def test_flex_gives_every_row_of_eager_at_every_shape(model_type, head, method):
    models = kernels(model_type, head, method)
    for length, pad in SHAPES:
        ids = token_ids(length, seed=length + pad)
        mask = padded_mask(ids, model_type, pad) if pad else torch.ones_like(ids)
        flex, eager = (outputs(models[b], ids, mask) for b in ("flex", "eager"))
        real = mask.bool() if flex.shape[1] == length else torch.ones(flex.shape[:2], dtype=torch.bool)
        for row in range(ids.shape[0]):
            got, want = flex[row][real[row]], eager[row][real[row]]
            assert torch.isfinite(got).all(), f"{method} {head} ({length}, pad {pad}): row {row} not finite"
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5, msg=f"({length}, pad {pad}) row {row}")


def test_flex_on_cpu_never_compiles_the_cpu_kernel(monkeypatch):
    """The CPU route is taken, not the compiled kernel: a call into it fails the test."""

    def compiled(*args, **kwargs):
        raise AssertionError("the compiled flex kernel ran on CPU")

    attention = posswap.portable.posswap_attention
    monkeypatch.setattr(attention, "compile_friendly_flex_attention", compiled)
    monkeypatch.setattr(posswap_flex_route, "flex_attention_forward", compiled)
    ids = token_ids(40)
    for method in ("alibi", "rope"):
        for model_type, head in MODELS:
            model = kernels(model_type, head, method)["flex"]
            outputs(model, ids, padded_mask(ids, model_type, 7))


def test_flex_refuses_attention_dropout_on_cpu_as_on_gpu():
    model = posswap.patch(make_model("bert", "BertModel"), posswap.AlibiConfig(max_length=LENGTH, backend="flex"))
    model.train()
    with pytest.raises(ValueError, match="Backend 'flex' has no attention dropout"):
        model(input_ids=token_ids(40))
