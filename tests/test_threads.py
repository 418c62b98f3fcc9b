"""One patched model served from several threads gives every call the output that call gives alone, as stock
transformers models do: a forward keeps its per-call state (cos/sin, the bias, its cache) to itself.

Every registered method x (tiny GPT-2, tiny BERT): outputs of inputs that differ in length, position offset
(explicit position_ids) and padding, each computed alone first, then from 4 threads at once (a barrier before
every round, so that the calls really overlap), compared exactly. And greedy ``generate`` from 4 threads; and
copies (deepcopy, pickle) that run with their own state, not the original's.
"""

from __future__ import annotations

import copy
import os
import pickle
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import transformers
from conftest import sharpen_qk
from test_common import FACTORIES

import posswap

THREADS, ROUNDS = 4, 40
OLD, NEW = 64, 256
CONFIGS = {
    "gpt2": lambda: transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, n_positions=OLD, vocab_size=99, bos_token_id=98, eos_token_id=98
    ),
    "bert": lambda: transformers.BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=OLD,
    ),
}
HEADS = {"gpt2": transformers.GPT2LMHeadModel, "bert": transformers.BertForMaskedLM}


def served(method: str, arch: str):
    torch.manual_seed(0)
    model = sharpen_qk(HEADS[arch](CONFIGS[arch]()).eval())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NoPE on an encoder warns
        posswap.patch(model, FACTORIES[method](NEW))
    providers = getattr(model.base_model, "posswap_bias_providers", [])
    with torch.no_grad():  # parameters that start at zero (TUPE-R's buckets) would hide their positions
        for param in (p for provider in providers for p in provider.parameters()):
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    return model


def inputs(arch: str, count: int = 8) -> list[dict]:
    """Inputs that differ in everything a per-call state depends on: length, positions, padding."""
    generator = torch.Generator().manual_seed(2)
    out = []
    for i in range(count):
        length, offset, padded = (24, 32, 40)[i % 3], 40 * (i % 4), i % 5
        ids = torch.randint(3, 99, (2, length), generator=generator)
        mask = torch.ones_like(ids)
        if padded:  # GPT-2 pads on the left, encoders on the right
            (mask[1, :padded] if arch == "gpt2" else mask[1, length - padded :]).zero_()
        call = dict(input_ids=ids, attention_mask=mask)
        if i % 4:  # and some without position_ids, where the model numbers the tokens itself
            call["position_ids"] = (torch.arange(length) + offset).expand(2, -1)
        out.append(call)
    return out


POSSWAP = os.path.dirname(posswap.__file__)


def yield_in_posswap(frame, event, arg):
    """Profile hook: give the other threads a turn at every function call and return in posswap's code, so that
    the calls interleave there (where a state shared between calls would be written and read), not only every
    5 ms (the interpreter's switch interval): a race then shows in a few dozen calls, not a few thousand."""
    if frame.f_code.co_filename.startswith(POSSWAP):
        time.sleep(0)


def run_threads(work, jobs: int) -> list:
    """``work(thread, round)`` from THREADS threads, ``jobs`` rounds each, every round started together."""
    barrier = threading.Barrier(THREADS, timeout=60)

    def worker(thread):
        results = []
        sys.setprofile(yield_in_posswap)  # this thread only
        try:
            for round_ in range(jobs):
                barrier.wait()
                results.append(work(thread, round_))
        except BaseException:
            barrier.abort()  # the others stop waiting instead of hanging
            raise
        finally:
            sys.setprofile(None)
        return results

    with ThreadPoolExecutor(THREADS) as pool:
        futures = [pool.submit(worker, t) for t in range(THREADS)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    for error in sorted(errors, key=lambda e: isinstance(e, threading.BrokenBarrierError)):
        raise error  # the first real error, not a thread that stopped because another failed
    return [f.result() for f in futures]


def logits(model, call: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**call).logits


@pytest.mark.parametrize("arch", CONFIGS)
@pytest.mark.parametrize("method", FACTORIES)
def test_threads_give_each_call_its_output_alone(method, arch):
    model = served(method, arch)
    calls = inputs(arch)
    alone = [logits(model, call) for call in calls]

    def work(thread, round_):
        i = (round_ + 3 * thread) % len(calls)  # the threads run different inputs in each round
        return i, logits(model, calls[i])

    results = [r for per_thread in run_threads(work, ROUNDS) for r in per_thread]
    wrong = [
        (i, (out - alone[i]).abs().max().item())
        for i, out in results
        if not torch.allclose(out, alone[i], atol=1e-6, rtol=0)
    ]
    assert not wrong, (
        f"{len(wrong)} of {len(results)} threaded outputs differ from the same call alone (max {max(d for _, d in wrong):.3g})"
    )


@pytest.mark.parametrize("method", FACTORIES)
def test_threaded_greedy_generate_equals_generate_alone(method):
    model = served(method, "gpt2")
    pad = model.config.eos_token_id
    prompts = []
    for i in range(THREADS):
        ids = torch.randint(3, 98, (2, 6 + 3 * i), generator=torch.Generator().manual_seed(10 + i))
        mask = torch.ones_like(ids)
        mask[1, : 1 + i] = 0  # left padding, different in every thread
        prompts.append(dict(input_ids=ids.masked_fill(mask == 0, pad), attention_mask=mask))
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=pad, output_logits=True, return_dict_in_generate=True)

    def generate(prompt):
        with torch.no_grad():
            out = model.generate(**prompt, **kwargs)
        return out.sequences, torch.stack(out.logits)

    alone = [generate(p) for p in prompts]
    results = run_threads(lambda thread, round_: generate(prompts[thread]), 3)
    for thread, per_thread in enumerate(results):
        for sequences, scores in per_thread:
            assert torch.equal(sequences, alone[thread][0]), f"thread {thread}: other tokens than alone"
            torch.testing.assert_close(scores, alone[thread][1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("arch", CONFIGS)
@pytest.mark.parametrize("method", FACTORIES)
def test_copies_run_on_their_own(method, arch):
    """No closure over a shared object: a deep copy and an unpickled copy give the original's outputs, from threads
    running the copies and the original together."""
    model = served(method, arch)
    calls = inputs(arch)
    alone = [logits(model, call) for call in calls]
    models = [model, copy.deepcopy(model), pickle.loads(pickle.dumps(model)), copy.deepcopy(model)]

    def work(thread, round_):
        i = (round_ + thread) % len(calls)
        return i, logits(models[thread], calls[i])

    for per_thread in run_threads(work, 8):
        for i, out in per_thread:
            torch.testing.assert_close(out, alone[i], atol=1e-6, rtol=0)


def _count_builds(model) -> list:
    """Wraps what a call's state holds (RoPE's cos/sin, a provider's bias and features) so that each build is
    recorded."""
    builds = []
    base = model.base_model
    owners = [base.posswap_rotary] if hasattr(base, "posswap_rotary") else list(base.posswap_bias_providers)
    for owner in owners:
        for name in ("cos_sin", "bias", "features"):
            real = getattr(owner, name, None)
            if real is not None:
                setattr(owner, name, lambda *args, _real=real, _name=name: builds.append(_name) or _real(*args))
    return builds


@pytest.mark.parametrize("arch", CONFIGS)
@pytest.mark.parametrize("method", ["rope", "alibi", "t5-bias", "tupe"])
def test_the_state_is_built_once_per_forward_and_per_layer_under_checkpointing(method, arch):
    """Kept to the call, the state is still shared by the layers (the speed of one build per forward); with
    gradient checkpointing every layer builds its own (a layer run again in the backward does what it did)."""
    model = served(method, arch)
    builds = _count_builds(model)
    call = inputs(arch)[1]
    logits(model, call)
    assert builds and len(builds) == len(set(builds))  # each kind once
    kinds = len(builds)
    builds.clear()
    model.train().gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model(**call).logits.sum().backward()
    assert len(builds) == kinds * model.config.num_hidden_layers * 2  # the forward and the backward's rerun
