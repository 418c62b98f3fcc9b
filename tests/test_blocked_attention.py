"""The blocked inference path of the bias methods (``portable/posswap_blocked.py``) gives the dense path's output.

Each test runs the same model twice: once with the dense bias (``BLOCK_BYTES`` huge: the path as it was) and once
blocked (``BLOCK_BYTES`` 0, tiny blocks so that a 40-token input spans several), and checks that the blocked run
really took the fast (shift-invariant, Hankel view) or the general (bias per block) route. Every bias method x
GPT-2 (causal) and BERT (padding mask, symmetric ALiBi), RoBERTa (position offset), with padding, explicit and
jumping position ids, a KV cache and generate. Training (gradients needed) takes its own path.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import make_model, padded_mask, sharpen_qk, token_ids

import posswap
from posswap.portable import posswap_attention, posswap_blocked, posswap_windows

NEW = 96
METHODS = {
    "alibi": lambda: posswap.AlibiConfig(max_length=NEW),
    "t5-bias": lambda: posswap.T5BiasConfig(max_length=NEW),
    "tupe-r": lambda: posswap.TupeConfig(max_length=NEW, relative=True, cls_reset=True),
}
MODELS = {"gpt2": "GPT2LMHeadModel", "bert": "BertModel", "roberta": "RobertaForMaskedLM"}
TOLERANCE = dict(atol=2e-5, rtol=1e-5)


def patched(model_type: str, method: str):
    model = posswap.patch(sharpen_qk(make_model(model_type, MODELS[model_type])), METHODS[method]())
    with torch.no_grad():  # T5 / TUPE-R tables start at zero: give every bucket its own value
        for provider in model.base_model.posswap_bias_providers.modules():
            if hasattr(provider, "relative_attention_bias"):
                provider.relative_attention_bias.weight.normal_(0, 1, generator=torch.Generator().manual_seed(3))
    return model


class Routes:
    """Counts the routes the blocked path took (wrapping the functions posswap_attention calls)."""

    def __init__(self, monkeypatch):
        self.counts = {"fast": 0, "general": 0}
        for route, name in (("fast", "fast_sdpa"), ("general", "general_sdpa")):
            original = getattr(posswap_attention, name)
            monkeypatch.setattr(posswap_attention, name, self._counting(route, original))

    def _counting(self, route, original):
        def run(*args, **kwargs):
            self.counts[route] += 1
            return original(*args, **kwargs)

        return run


@pytest.fixture
def routes(monkeypatch):
    monkeypatch.setattr(posswap_blocked, "MIN_ROWS", 4)
    monkeypatch.setattr(posswap_windows, "FAST_ROWS", 16)
    return Routes(monkeypatch)


def both(monkeypatch, run):
    """``run()`` with the dense bias, then blocked."""
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 2**62)
    with torch.no_grad():
        dense = run()
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 0)
    with torch.no_grad():
        blocked = run()
    return dense, blocked


def first(out):
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", MODELS)
def test_blocked_equals_dense_with_and_without_padding(monkeypatch, routes, model_type, method):
    model = patched(model_type, method)
    ids = token_ids(40)
    mask = padded_mask(ids, model_type, 7)
    dense, blocked = both(monkeypatch, lambda: first(model(input_ids=ids)))
    torch.testing.assert_close(blocked, dense, **TOLERANCE)
    assert routes.counts == {"fast": 2, "general": 0}  # one call per layer, no padding: the Hankel view
    before = dict(routes.counts)
    dense, blocked = both(monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask)))
    real = mask.bool()
    torch.testing.assert_close(blocked[real], dense[real], **TOLERANCE)
    # right padding (encoders) stays on the fast route; GPT-2's left padding moves the positions: general
    route = "fast" if model_type != "gpt2" else "general"
    assert routes.counts[route] == before[route] + 2


@pytest.mark.parametrize("method", METHODS)
def test_a_mask_of_batch_one_serves_every_sequence(monkeypatch, routes, method):
    """A 4D boolean mask of batch 1 over a batch of 2 (right padding): both sequences read through it, as on the
    dense path (the fast route once filled only the first sequence's output)."""
    model = patched("bert", method)
    ids = token_ids(40)
    mask = torch.ones(1, 1, 40, 40, dtype=torch.bool)
    mask[..., 33:] = False
    dense, blocked = both(monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask)))
    torch.testing.assert_close(blocked[:, :33], dense[:, :33], **TOLERANCE)
    assert routes.counts["fast"] == 2


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_blocked_equals_dense_with_explicit_and_jumping_ids(monkeypatch, routes, model_type, method):
    model = patched(model_type, method)
    ids = token_ids(40)
    shifted = torch.arange(5, 45)[None].expand(2, -1)  # contiguous from 5: still the fast route
    jumping = torch.cat([torch.arange(20), torch.arange(50, 70)])[None].expand(2, -1)
    for positions, route in ((shifted, "fast"), (jumping, "general")):
        before = dict(routes.counts)
        dense, blocked = both(monkeypatch, lambda p=positions: first(model(input_ids=ids, position_ids=p)))
        torch.testing.assert_close(blocked, dense, **TOLERANCE)
        assert routes.counts[route] == before[route] + 2


@pytest.mark.parametrize("method", METHODS)
def test_blocked_equals_dense_with_a_kv_cache(monkeypatch, routes, method):
    """A prefix, then 20 tokens on its cache (implicit ids, then ids that jump), then one more token."""
    model = patched("gpt2", method)
    ids = token_ids(41)
    jump = torch.arange(60, 80)[None].expand(2, -1)

    def cached(positions):
        prefix = model(input_ids=ids[:, :20], use_cache=True)
        step = model(input_ids=ids[:, 20:40], position_ids=positions, past_key_values=prefix.past_key_values)
        last = model(input_ids=ids[:, 40:], past_key_values=step.past_key_values)
        return torch.cat([prefix.logits, step.logits, last.logits], dim=1)

    for positions in (None, jump):
        dense, blocked = both(monkeypatch, lambda p=positions: cached(p))
        torch.testing.assert_close(blocked, dense, **TOLERANCE)
    assert routes.counts["fast"] > 0 and routes.counts["general"] > 0


@pytest.mark.parametrize("method", METHODS)
def test_blocked_generate_equals_dense(monkeypatch, routes, method):
    model = patched("gpt2", method)
    ids = token_ids(30)
    mask = padded_mask(ids, "gpt2", 6)

    def generate():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            output_scores=True,
            return_dict_in_generate=True,
        )
        return out.sequences, torch.stack(out.scores)

    (dense_ids, dense_scores), (blocked_ids, blocked_scores) = both(monkeypatch, generate)
    assert torch.equal(blocked_ids, dense_ids)
    torch.testing.assert_close(blocked_scores, dense_scores, **TOLERANCE)
    assert routes.counts["general"] > 0


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_training_takes_neither_inference_route(monkeypatch, routes, model_type, method):
    """With gradients the inference routes are never taken (even with BLOCK_BYTES 0): training has its own blocked
    path (``posswap_blocked_grad.py``, tested in test_blocked_training.py), whose gradients equal the dense path's."""
    ids = token_ids(40)

    def gradients(block_bytes):
        monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", block_bytes)
        model = patched(model_type, method).train()
        for module in model.modules():  # no dropout: only the gradient keeps the inference routes away
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        weights = torch.randn(2, 40, model.config.vocab_size if model_type == "gpt2" else 32)
        (first(model(input_ids=ids)) * weights).sum().backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    dense, blocked = gradients(2**62), gradients(0)
    assert dense.keys() == blocked.keys()
    scale = max(g.abs().max() for g in dense.values())
    for name in dense:
        torch.testing.assert_close(blocked[name], dense[name], atol=1e-5 * scale, rtol=1e-4)
    assert routes.counts == {"fast": 0, "general": 0}
    model = patched(model_type, method)  # eval, but grad enabled and weights that need grad: not inference either
    first(model(input_ids=ids))
    assert routes.counts == {"fast": 0, "general": 0}


def test_each_thread_gets_its_own_blocked_output(monkeypatch, routes):
    """Two threads at two lengths (one padded) at once: each gets the output it gets alone."""
    model = patched("bert", "t5-bias")
    inputs = [
        dict(input_ids=token_ids(40)),
        dict(input_ids=token_ids(24), attention_mask=padded_mask(token_ids(24), "bert", 5)),
    ]
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 0)
    with torch.no_grad():
        alone = [first(model(**kwargs)) for kwargs in inputs]
    got = [None, None]

    def run(i):
        with torch.no_grad():
            for _ in range(5):
                got[i] = first(model(**inputs[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(2):
        assert torch.equal(got[i], alone[i])
    assert routes.counts["fast"] > 0  # the blocked path ran (BLOCK_BYTES 0)


def test_the_hankel_view_is_the_dense_bias():
    """The fast route's (rows, reversed keys) views equal the provider's dense bias, causal and symmetric, with
    cached keys; and they are views (no (q, k) tensor)."""
    from posswap.portable.posswap_alibi import AlibiBias

    for symmetric in (False, True):
        provider = AlibiBias(4, symmetric)
        q_len, k_len = 6, 9
        vector = posswap_blocked.distance_vector(provider, q_len, k_len, not symmetric, torch.float32)
        dense = provider.bias(torch.arange(3, 9)[None], torch.arange(9)[None])[0]
        if not symmetric:
            dense = dense.masked_fill(
                ~torch.ones(q_len, k_len, dtype=torch.bool).tril(3), torch.finfo(torch.float32).min
            )
        for rows, keys in (((0, 6), 9), ((2, 5), 8)):
            view = posswap_blocked.hankel(vector, 3, q_len, rows, keys)
            assert view.untyped_storage().data_ptr() == vector.untyped_storage().data_ptr()
            torch.testing.assert_close(view[0], dense[:, rows[0] : rows[1], :keys].flip(-1), rtol=0, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_window_calls_read_every_weighed_key_once_with_its_bias(monkeypatch, causal, threads):
    """``posswap_windows.plan_calls``: every (head, query, key) pair within the head's window (a decoder's: not a later
    key) is read by exactly one call, split parts included, and a decoder's call reads no key after its last query
    (the bias masks the later keys of its own block); each call's bias view is the dense bias there."""
    monkeypatch.setattr(posswap_windows, "FAST_ROWS", 16)
    monkeypatch.setattr(posswap_windows, "MIN_PART", 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    windows = posswap_windows.group_heads([5, 6, 20, 40, 200], [0] * 5 if causal else [7, 6, 20, 3, 200])
    heads = 5
    lengths = ((100, 100), (37, 90)) if causal else ((100, 100),)  # (queries, keys): cached keys for a decoder
    vector = torch.randn(heads, 400)
    for q_len, k_len in lengths:
        past, zero_at = k_len - q_len, 200
        reads = torch.zeros(heads, q_len, k_len, dtype=torch.long)
        for call in posswap_windows.plan_calls(windows, q_len, k_len, causal, 1):
            assert not causal or call.end <= past + call.start + call.rows
            bias = posswap_windows.bias_of(vector, zero_at, call, past)
            part = call.rows // call.split
            for s in range(call.split):
                rows = torch.arange(call.start + s * part, call.start + (s + 1) * part)
                keys = torch.arange(call.end - 1, call.first - 1, -1)  # reversed, as the call reads them
                expected = vector[call.heads][:, zero_at + past + rows[:, None] - keys[None]]
                torch.testing.assert_close(bias[s], expected, rtol=0, atol=0)
                reads[call.heads, rows[:, None], keys[None]] += 1
        assert int(reads.max()) == 1
        distance = past + torch.arange(q_len)[:, None] - torch.arange(k_len)[None]  # query minus key
        for window in windows:
            weighed = (distance <= window.before) & (distance >= (0 if causal else -window.after))
            assert bool((reads[window.heads][:, weighed] == 1).all())
