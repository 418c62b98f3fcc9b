"""One common body for every method (as peft's PeftCommonTester): a new method brings only a config factory.

Each test runs for every (method x architecture x head) it applies to: save/load round trip, an error inside
the run-time install undone, too-long input, KV cache equals the full pass, left padding, and the real MiniLM
forward and backward at 2048.
"""

from __future__ import annotations

import pytest
import torch
from conftest import (
    FACTORIES,
    MODEL_IDS,
    MODELS,
    OLD_LENGTH,
    assert_decoding_equals_full_pass,
    assert_untouched,
    make_model,
    outputs,
    padded_mask,
    reload_and_compare,
    sharpen_qk,
    snapshot,
    token_ids,
)

import posswap
from posswap.portable import posswap_runtime
from posswap.registry import METHODS

NEW_LENGTH = 4 * OLD_LENGTH


def test_every_registered_method_has_a_factory():
    assert set(FACTORIES) == set(METHODS)


def patched(method: str, model_type: str = "gpt2", head: str = "GPT2LMHeadModel", length: int = NEW_LENGTH):
    return posswap.patch(sharpen_qk(make_model(model_type, head)), FACTORIES[method](length)).eval()


@pytest.mark.parametrize("method", FACTORIES)
@pytest.mark.parametrize("model_type,head", MODELS, ids=MODEL_IDS)
def test_round_trip_gives_identical_logits(method, model_type, head, tmp_path):
    reload_and_compare(patched(method, model_type, head), tmp_path, NEW_LENGTH)


@pytest.mark.parametrize("method", FACTORIES)
@pytest.mark.parametrize("model_type,head", [("gpt2", "GPT2LMHeadModel"), ("roberta", "RobertaForMaskedLM")])
def test_too_long_input_is_a_clear_error(method, model_type, head):
    model = patched(method, model_type, head)
    assert torch.isfinite(outputs(model, token_ids(NEW_LENGTH))).all()
    with pytest.raises(ValueError, match=f"reads at most {NEW_LENGTH} tokens"):
        outputs(model, token_ids(NEW_LENGTH + 1))


@pytest.mark.parametrize("method", [m for m in FACTORIES if m in posswap_runtime.INSTALLERS])
def test_a_failure_in_the_run_time_install_is_undone(method, monkeypatch):
    model = sharpen_qk(make_model("bert", "BertForMaskedLM"))
    before, config_class = snapshot(model), type(model.config)
    ids = token_ids(20)
    expected = outputs(model, ids)
    real = posswap_runtime.INSTALLERS[method]

    def installs_then_fails(*args):
        real(*args)  # everything installed, then the failure: all of it must be undone
        raise RuntimeError("injected failure")

    monkeypatch.setitem(posswap_runtime.INSTALLERS, method, installs_then_fails)
    with pytest.raises(RuntimeError, match="injected failure"):
        posswap.patch(model, FACTORIES[method](NEW_LENGTH))
    assert_untouched(model, before)
    assert type(model.config) is config_class and not hasattr(model.config, "posswap")
    torch.testing.assert_close(outputs(model, ids), expected)


@pytest.mark.parametrize("method", FACTORIES)
def test_kv_cache_decoding_equals_the_full_pass(method):
    model = patched(method)
    assert_decoding_equals_full_pass(model, token_ids(40, batch=1), 16, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", FACTORIES)
def test_left_padded_generation_equals_rows_alone(method):
    model = patched(method)
    pad = model.config.eos_token_id
    long, short = token_ids(12, batch=1, seed=3), token_ids(7, batch=1, seed=4)
    batch = torch.cat([long, torch.cat([torch.full((1, 5), pad), short], dim=1)])
    mask = torch.ones_like(batch)
    mask[1, :5] = 0
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
    together = model.generate(input_ids=batch, attention_mask=mask, **kwargs)
    for row, ids in enumerate([long, short]):
        alone = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        assert torch.equal(together.sequences[row, -6:], alone.sequences[0, -6:])
        for a, b in zip(together.logits, alone.logits):
            torch.testing.assert_close(a[row], b[0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", FACTORIES)
def test_minilm_reads_2048_forward_and_backward(method, minilm_path):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(minilm_path)
    del model.encoder.layer[2:]  # the real weights and positions at 2048; four more equal layers add only time
    model = posswap.patch(model, FACTORIES[method](2048)).train()
    ids = torch.randint(1000, 20000, (1, 2048), generator=torch.Generator().manual_seed(0))
    hidden = model(input_ids=ids).last_hidden_state
    hidden.pow(2).mean().backward()
    assert torch.isfinite(hidden).all()
    unused = [
        n for n, p in model.named_parameters() if p.requires_grad and p.grad is None and not n.startswith("pooler.")
    ]
    assert unused == []  # the pooler is not on this path; anything else unused would fail DDP


def _without_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model.train()


def _gradients(model, ids, mask) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, attention_mask=mask)
    (out.logits if hasattr(out, "logits") else out.last_hidden_state).pow(2).mean().backward()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("method", FACTORIES)
@pytest.mark.parametrize(
    "model_type,head",
    [
        ("gpt2", "GPT2LMHeadModel"),
        ("bert", "BertForMaskedLM"),
        ("roberta", "RobertaForMaskedLM"),
        ("electra", "ElectraForPreTraining"),
    ],
)
def test_gradient_checkpointing_gives_the_plain_gradients(method, model_type, head, reentrant):
    """A training step with gradient checkpointing (both of torch's modes) gives every parameter the gradient of
    the plain step: the layers run again in the backward pass must do what they did in the forward."""
    model = _without_dropout(patched(method, model_type, head))
    ids = token_ids(24)
    mask = padded_mask(ids, model_type, 5)
    plain = _gradients(model, ids, mask)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    checkpointed = _gradients(model, ids, mask)
    assert [n for n, g in plain.items() if g is None] == [n for n, g in checkpointed.items() if g is None]
    for name, grad in plain.items():
        if grad is not None:
            torch.testing.assert_close(
                checkpointed[name], grad, atol=1e-6, rtol=1e-4, msg=lambda m, name=name: f"{name}: {m}"
            )
