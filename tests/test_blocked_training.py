"""The blocked training path of the bias methods (``portable/posswap_blocked_grad.py``, issue 31) gives the dense
path's gradients.

First the autograd function itself against a dense reference built in the test (the bias gathered whole from the
table, SDPA's math): causal and bidirectional, padding on either side, positions that jump, with and without the
table's gradient. Then whole models, GPT-2 and BERT, every bias method, with left and right padding: every
parameter's gradient (q, k, v projections, T5's bucket table, TUPE-R's) equals the dense path's (BLOCK_BYTES huge),
and the blocked run really took the path (a counter). Last: a CPU training step at a long input takes it with the
default threshold, gradient checkpointing runs through it, and dropout keeps the dense path.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_model, padded_mask, sharpen_qk, token_ids
from test_blocked_attention import METHODS, first, patched

import posswap
from posswap.portable import (
    posswap_attention,
    posswap_blocked,
    posswap_blocked_grad,
    posswap_far_split,
    posswap_windows,
)
from posswap.portable.posswap_blocked_grad import BlockedBiasAttention

LOWEST = torch.finfo(torch.float32).min


class Calls:
    """Counts the calls of the training path (wrapping the function posswap_attention calls)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = posswap_attention.BlockedBiasAttention.apply

        def apply(*args):
            self.count += 1
            return original(*args)

        monkeypatch.setattr(posswap_attention.BlockedBiasAttention, "apply", apply)


@pytest.fixture
def calls(monkeypatch):
    monkeypatch.setattr(posswap_blocked, "MIN_ROWS", 4)  # a 40-token input spans several blocks
    monkeypatch.setattr(posswap_windows, "FAST_ROWS", 16)
    return Calls(monkeypatch)


# --- the function against a dense reference ----------------------------------------------------------------------


def dense_reference(q, k, v, table, q_pos, k_pos, lo, mask, causal, scaling):
    bias = table[:, q_pos[:, :, None] - k_pos[:, None, :] - lo].movedim(0, 1)
    keep = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(k.shape[2] - q.shape[2]) if causal else None
    keep = mask if mask is not None else keep
    if keep is not None:
        bias = bias.masked_fill(~keep, LOWEST)
    # softmax by hand: torch's CPU flash backward (SDPA's, for a mask without gradient) is wrong on a row with
    # every key masked
    return torch.softmax(q @ k.transpose(-1, -2) * scaling + bias, dim=-1) @ v


CASES = {  # name: (causal, padding side, jumping positions)
    "causal": (True, None, False),
    "bidirectional": (False, None, False),
    "causal-left-padding": (True, "left", False),
    "bidirectional-right-padding": (False, "right", False),
    "causal-jumping": (True, None, True),
    "bidirectional-jumping-padded": (False, "right", True),
}


@pytest.mark.parametrize("table_grad", [True, False], ids=["table-grad", "no-table-grad"])
@pytest.mark.parametrize("case", CASES)
def test_function_gradients_equal_the_dense_reference(calls, case, table_grad):
    causal, padding, jumping = CASES[case]
    gen = torch.Generator().manual_seed(0)
    b, h, n, d = 2, 3, 37, 8
    q, k, v = (torch.randn(b, h, n, d, generator=gen).requires_grad_() for _ in range(3))
    pos = torch.cat([torch.arange(20), torch.arange(45, 45 + n - 20)]) if jumping else torch.arange(n)
    positions = (pos[None], pos[None])
    mask = None
    if padding:
        keep = torch.ones(b, n, dtype=torch.bool)
        keep[1] = torch.arange(n) >= 6 if padding == "left" else torch.arange(n) < n - 6  # sequence 1: 6 padded
        mask = keep[:, None, None, :] & (torch.ones(n, n, dtype=torch.bool).tril() if causal else True)
    provider = type("Table", (), {})()
    weights = torch.randn(h, 2 * (n + 30), generator=gen).requires_grad_(table_grad)
    provider.bias = lambda qp, kp: weights[:, qp[..., :, None] - kp[..., None, :] + n + 29].movedim(0, 1)
    table, plan = posswap_blocked_grad.make_plan(provider, positions, mask, causal, d**-0.5, torch.float32)
    assert (plan.q_pos is None) != jumping  # contiguous positions: the strided view; jumping: the gather
    out = BlockedBiasAttention.apply(q, k, v, table, plan)
    reference = dense_reference(q, k, v, table, *positions, plan.lo, mask, causal, d**-0.5)
    grad = torch.randn(out.shape, generator=gen)
    if padding == "left" and causal:  # rows with every key masked: their output is even, their gradient too
        assert bool((mask.sum(-1) == 0).any())
    torch.testing.assert_close(out, reference, atol=2e-5, rtol=1e-5)
    wanted = (q, k, v, weights) if table_grad else (q, k, v)
    got_all = torch.autograd.grad(out, wanted, grad, retain_graph=True)  # the table is in both graphs
    for got, expected in zip(got_all, torch.autograd.grad(reference, wanted, grad)):
        torch.testing.assert_close(got, expected, atol=5e-5, rtol=1e-4)


class BandCalls:
    """Counts the band route of the table's gradient (``posswap_far_split.band_gradients``)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = posswap_far_split.band_gradients

        def band(*args):
            self.count += 1
            return original(*args)

        monkeypatch.setattr(posswap_far_split, "band_gradients", band)


@pytest.mark.parametrize(
    ("n", "q_len", "far"), [(37, 37, 5), (37, 20, 5), (300, 300, 21)], ids=["every-query", "queries-last", "long"]
)
def test_far_distances_sharing_a_parameter_take_the_band_route(monkeypatch, calls, n, q_len, far):
    """A causal provider whose distances from ``far`` on read one parameter (as T5's last bucket): the table's
    gradient from the keys near each query plus the row-sum identity equals the dense reference's. Every key a
    query: backward takes the far keys through the causal kernel and the band apart (``posswap_far_split``; a long
    input has many band blocks, which the far bucket's row sums cross)."""
    band = BandCalls(monkeypatch)
    split = []
    original = posswap_far_split.backward
    monkeypatch.setattr(posswap_far_split, "backward", lambda *a: split.append(1) or original(*a))
    gen = torch.Generator().manual_seed(1)
    b, h, d = 2, 3, 8
    q = torch.randn(b, h, q_len, d, generator=gen).requires_grad_()
    k, v = (torch.randn(b, h, n, d, generator=gen).requires_grad_() for _ in range(2))
    weights = torch.randn(h, far + 2, generator=gen).requires_grad_()  # column 0: every negative distance

    class Provider:
        far_distance = far

        def bias(self, q_pos, k_pos):
            column = (q_pos[..., :, None] - k_pos[..., None, :]).clamp(-1, far) + 1
            return weights[:, column].movedim(0, 1)

    positions = (torch.arange(n - q_len, n)[None], torch.arange(n)[None])
    table, plan = posswap_blocked_grad.make_plan(Provider(), positions, None, True, d**-0.5, torch.float32)
    assert plan.far == far and plan.q_pos is None
    out = BlockedBiasAttention.apply(q, k, v, table, plan)
    reference = dense_reference(q, k, v, table, *positions, plan.lo, None, True, d**-0.5)
    grad = torch.randn(out.shape, generator=gen)
    got_all = torch.autograd.grad(out, (q, k, v, weights), grad, retain_graph=True)
    for got, expected in zip(got_all, torch.autograd.grad(reference, (q, k, v, weights), grad)):
        torch.testing.assert_close(got, expected, atol=5e-5, rtol=1e-4)
    assert band.count == 1 and len(split) == (q_len == n)


@pytest.mark.parametrize(("buckets", "max_distance"), [(32, 128), (8, 12), (16, 9)])
def test_t5_far_distance_is_where_a_decoders_last_bucket_begins(buckets, max_distance):
    from posswap.portable.posswap_t5 import T5Buckets, t5_buckets

    assert T5Buckets(2, buckets, max_distance, bidirectional=True).far_distance is None  # two sides: two buckets
    far = T5Buckets(2, buckets, max_distance, bidirectional=False).far_distance
    behind = -torch.arange(0, 20 * max_distance)  # key minus query: T5's sign
    found = t5_buckets(behind, False, buckets, max_distance)
    assert bool((found[far:] == buckets - 1).all())


@pytest.mark.parametrize("method", ["t5-bias", "tupe-r"])
def test_a_decoder_without_padding_gets_the_dense_gradients_through_the_band_route(monkeypatch, calls, method):
    """GPT-2, no padding: T5 bias with a max_distance shorter than the input (so the last bucket holds the far
    keys) and TUPE-R (its buckets reach past the input); every parameter's gradient equals the dense path's."""
    band = BandCalls(monkeypatch)
    configs = {
        "t5-bias": posswap.T5BiasConfig(max_length=96, num_buckets=8, max_distance=12),
        "tupe-r": posswap.TupeConfig(max_length=96, relative=True, cls_reset=True),
    }
    monkeypatch.setitem(METHODS, method, lambda: configs[method])
    dense = gradients(monkeypatch, "gpt2", method, 2**62)
    blocked = gradients(monkeypatch, "gpt2", method, 0)
    assert calls.count == 2 and band.count == 2  # every layer on the blocked path, its table's gradient by band
    assert_same_gradients(blocked, dense)
    table = [name for name in dense if name.endswith("relative_attention_bias.weight")]
    assert table and all(dense[name].abs().max() > 0 for name in table)


# --- whole models ------------------------------------------------------------------------------------------------


def no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model


def gradients(monkeypatch, model_type, method, block_bytes, mask=None, position_ids=None, checkpointing=None):
    """Every parameter's gradient of a loss on the real tokens (as training's, whose labels skip padding)."""
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", block_bytes)
    model = no_dropout(patched(model_type, method).train())
    if checkpointing is not None:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": checkpointing})
    ids = token_ids(40)
    out = first(model(input_ids=ids, attention_mask=mask, position_ids=position_ids))
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    real = torch.ones(ids.shape, dtype=torch.bool) if mask is None else mask.bool()
    (out * weights)[real].sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(blocked: dict, dense: dict) -> None:
    assert blocked.keys() == dense.keys()
    scale = max(g.abs().max() for g in dense.values())  # some are zero in theory (a key bias): rounding only
    for name in dense:
        torch.testing.assert_close(blocked[name], dense[name], atol=1e-5 * scale, rtol=1e-4, msg=name)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_model_gradients_equal_the_dense_path(monkeypatch, calls, model_type, method):
    """A batch of one sequence unpadded and one padded: GPT-2 on the left, BERT on the right (``padded_mask``).
    Without any padding: test_blocked_attention's test_training_takes_neither_inference_route."""
    mask = padded_mask(token_ids(40), model_type, 7)
    dense = gradients(monkeypatch, model_type, method, 2**62, mask)
    assert calls.count == 0
    blocked = gradients(monkeypatch, model_type, method, 0, mask)
    assert calls.count == 2  # one call per layer
    assert_same_gradients(blocked, dense)
    table = [n for n in dense if n.endswith("relative_attention_bias.weight")]
    assert bool(table) == (method != "alibi") and all(dense[n].abs().max() > 0 for n in table)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_on_the_other_side_and_jumping_ids(monkeypatch, calls, side):
    """GPT-2 with right padding, BERT with left padding, and T5 bias with ids that jump (the gather route)."""
    model_type = "gpt2" if side == "right" else "bert"
    mask = padded_mask(token_ids(40), "bert" if side == "right" else "gpt2", 7)
    jumping = torch.cat([torch.arange(20), torch.arange(50, 70)])[None].expand(2, -1)
    for position_ids in (None, jumping):
        dense = gradients(monkeypatch, model_type, "t5-bias", 2**62, mask, position_ids)
        blocked = gradients(monkeypatch, model_type, "t5-bias", 0, mask, position_ids)
        assert_same_gradients(blocked, dense)
    assert calls.count == 4


def test_a_row_with_every_key_masked_gets_the_softmax_gradient(monkeypatch, calls):
    """GPT-2's left padding leaves padded queries no key at all: their output is the even average of every key.
    With a loss on every token, the blocked path gives the eager softmax's gradient (torch's CPU flash backward,
    which the dense sdpa route takes for ALiBi, gives keys x that on such rows)."""

    def all_tokens(backend, block_bytes):
        monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", block_bytes)
        config = posswap.AlibiConfig(max_length=96, backend=backend)
        model = no_dropout(posswap.patch(sharpen_qk(make_model("gpt2", "GPT2LMHeadModel")), config).train())
        ids = token_ids(40)
        out = model(input_ids=ids, attention_mask=padded_mask(ids, "gpt2", 7)).logits
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(5))).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    eager, blocked = all_tokens("eager", 2**62), all_tokens("sdpa", 0)
    assert calls.count == 2
    assert_same_gradients(blocked, eager)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_runs_through_the_blocked_path(monkeypatch, calls, reentrant):
    mask = padded_mask(token_ids(40), "gpt2", 7)
    plain = gradients(monkeypatch, "gpt2", "t5-bias", 0, mask)
    before = calls.count
    checkpointed = gradients(monkeypatch, "gpt2", "t5-bias", 0, mask, checkpointing=reentrant)
    assert calls.count - before >= 2  # the layers ran on it (again in the backward)
    assert_same_gradients(checkpointed, plain)


def test_a_cpu_training_step_at_a_long_input_takes_the_blocked_path(calls):
    """The default threshold: a (heads, n, n) bias over BLOCK_BYTES (4 heads x 768^2 x 4 bytes = 9 MiB)."""
    model = no_dropout(posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), posswap.T5BiasConfig(max_length=1024)))
    ids = token_ids(768, batch=1)
    model.train()(input_ids=ids, labels=ids).loss.backward()
    assert calls.count == 2
    assert model.transformer.posswap_bias_providers[0].relative_attention_bias.weight.grad.abs().max() > 0
    with torch.no_grad():  # inference: the inference route, not this one
        model(input_ids=ids)
    assert calls.count == 2
    short = token_ids(64, batch=1)  # a small bias: dense, shared by the layers
    model(input_ids=short, labels=short).loss.backward()
    assert calls.count == 2


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_dropout_gradients_equal_a_reference_with_the_same_masks(monkeypatch, calls, causal):
    """Attention dropout: each block's keep mask comes from ``dropout_scale`` (a generator per block, seeded from the
    call's seed), drawn again in backward; a dense reference given the same masks has the same output and
    gradients, and the masks really drop."""
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 0)  # blocks of MIN_ROWS rows
    gen = torch.Generator().manual_seed(0)
    b, h, n, d = 2, 3, 23, 8
    q, k, v = (torch.randn(b, h, n, d, generator=gen).requires_grad_() for _ in range(3))
    weights = torch.randn(h, 2 * n - 1, generator=gen).requires_grad_()
    provider = type("Table", (), {})()
    provider.bias = lambda qp, kp: weights[:, qp[..., :, None] - kp[..., None, :] + n - 1].movedim(0, 1)
    pos = torch.arange(n)[None]
    table, plan = posswap_blocked_grad.make_plan(provider, (pos, pos), None, causal, d**-0.5, torch.float32, 0.3)
    out = BlockedBiasAttention.apply(q, k, v, table, plan, 1234)
    scale = torch.zeros(b, h, n, n)
    for start in range(0, n, posswap_blocked.MIN_ROWS):
        stop = min(n, start + posswap_blocked.MIN_ROWS)
        keys = stop if causal else n  # a decoder's block reads no key after its last query
        drop = posswap_blocked_grad.dropout_scale(plan, (b, h, stop - start, keys), 1234, start)
        scale[:, :, start:stop, :keys] = drop.flip(-1)  # drawn over the keys in reverse order
    assert 0.2 < float((scale[:, :, :, :1] == 0).float().mean()) < 0.4
    bias = table[:, pos[0][:, None] - pos[0][None, :] - plan.lo][None]
    if causal:
        bias = bias.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), LOWEST)
    reference = (torch.softmax(q @ k.transpose(-1, -2) * d**-0.5 + bias, dim=-1) * scale) @ v
    torch.testing.assert_close(out, reference, atol=2e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad(out, (q, k, v, weights), grad, retain_graph=True)
    for mine, expected in zip(got, torch.autograd.grad(reference, (q, k, v, weights), grad)):
        torch.testing.assert_close(mine, expected, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_model_with_attention_dropout_trains_on_the_blocked_path(monkeypatch, calls, reentrant):
    """GPT-2 with attention dropout 0.1 (its default): the blocked path, whose seeds come from torch's RNG, so a
    checkpointed layer run again in backward draws the masks of its forward (same gradients as without)."""

    def step(checkpointing):
        model = patched("gpt2", "t5-bias").train()
        for block in model.transformer.h:
            block.attn.resid_dropout.p = 0.0
        model.transformer.drop.p = 0.0
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        torch.manual_seed(7)
        out = first(model(input_ids=token_ids(40)))
        (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(5))).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 0)
    plain = step(False)
    assert calls.count == 2
    assert_same_gradients(step(True), plain)
    assert calls.count >= 4


def test_backend_eager_and_other_dtypes_keep_the_dense_path(monkeypatch, calls):
    """``backend`` still picks the kernel: eager never takes the blocked path; nor does a float64 model."""
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 0)
    config = posswap.T5BiasConfig(max_length=96, backend="eager")
    eager = no_dropout(posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), config).train())
    first(eager(input_ids=token_ids(40))).sum().backward()
    wide = no_dropout(patched("gpt2", "t5-bias").train().double())
    first(wide(input_ids=token_ids(40))).sum().backward()
    assert calls.count == 0
    first(patched("gpt2", "t5-bias").train()(input_ids=token_ids(40))).sum().backward()
    assert calls.count == 2


# --- keys too far to weigh: no denormal numbers ------------------------------------------------------------------


def steep_alibi(h: int, n: int, slope: float = 4.0):
    """A provider whose bias falls ``slope`` a position (ALiBi's first head at 8 heads falls 0.5): far keys weigh
    e^-100 and less, where the exponential gives denormal numbers."""
    provider = type("Steep", (), {})()
    slopes = slope * torch.arange(1, h + 1, dtype=torch.float32)[:, None, None] / h
    provider.bias = lambda qp, kp: (-slopes * (qp[..., :, None] - kp[..., None, :]).abs()).expand(
        qp.shape[0], -1, -1, -1
    )
    return provider


@pytest.mark.parametrize("batch", [1, 2], ids=["split-queries", "batch-2"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_negligible_keys_are_cut_without_changing_outputs_or_gradients(calls, monkeypatch, causal, batch):
    """Each head reads only the keys it can weigh (``posswap_windows``): with batch 1 a call's queries split in the
    batch dimension for the threads; outputs and gradients those of the whole dense bias."""
    planned = []
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # the parts a batch of 1 is split in: for 2 threads
    monkeypatch.setattr(posswap_windows, "MIN_PART", 4)
    original = posswap_windows.plan_calls
    monkeypatch.setattr(posswap_windows, "plan_calls", lambda *a: planned.append(original(*a)) or planned[-1])
    gen = torch.Generator().manual_seed(3)
    b, h, n, d = batch, 3, 128, 8
    q, k, v = (torch.randn(b, h, n, d, generator=gen).requires_grad_() for _ in range(3))
    positions = (torch.arange(n)[None], torch.arange(n)[None])
    table, plan = posswap_blocked_grad.make_plan(steep_alibi(h, n), positions, None, causal, d**-0.5, torch.float32)
    cut = posswap_windows.reach(table, -plan.lo, q, k, plan.scaling)[0]
    assert bool((cut == LOWEST).any()) and torch.equal(cut[:, -plan.lo], table[:, -plan.lo])  # own key kept

    # the weights of the whole table hold denormal numbers; with the cut none (what makes x86 slow)
    def weights(t):
        return torch.softmax(q @ k.transpose(-1, -2) * plan.scaling + dense_bias(t, positions, plan, causal), -1)

    tiny = torch.finfo(torch.float32).tiny
    assert bool(((weights(table) > 0) & (weights(table) < tiny)).any())
    assert not bool(((weights(cut) > 0) & (weights(cut) < tiny)).any())

    out = BlockedBiasAttention.apply(q, k, v, table, plan)
    reference = dense_reference(q, k, v, table, *positions, plan.lo, None, causal, d**-0.5)
    torch.testing.assert_close(out, reference, atol=2e-5, rtol=1e-5)
    grad = torch.randn(out.shape, generator=gen)
    for got, expected in zip(
        torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(reference, (q, k, v), grad)
    ):
        torch.testing.assert_close(got, expected, atol=5e-5, rtol=1e-4)
    with torch.no_grad():  # the inference route cuts its distance vector the same way
        vector = posswap_blocked.distance_vector(steep_alibi(h, n), n, n, causal, torch.float32)
        fast = posswap_blocked.fast_sdpa(q, k, v, vector, causal, None, d**-0.5)
    torch.testing.assert_close(fast, reference.detach(), atol=2e-5, rtol=1e-5)
    assert all(any(c.first > 0 for c in p) for p in planned)  # every call skipped keys too far back to weigh
    assert any(c.split > 1 for p in planned for c in p) == (batch == 1)  # threads: batch x heads for the kernel


def dense_bias(table, positions, plan, causal):
    bias = table[:, positions[0][:, :, None] - positions[1][:, None, :] - plan.lo].movedim(0, 1)
    if causal:
        bias = bias.masked_fill(~torch.ones(bias.shape[-2:], dtype=torch.bool).tril(), LOWEST)
    return bias
