"""The decoder and encoder-decoder families (issue 61: opt, gpt_neo, bart, mbart) where they differ from the encoders:
OPT's positions from the attention mask and its table's own offset of 2, GPT-Neo's causal mask with its local window,
BART's two tables; generation through the KV cache; a copy-extended model against the stock model built at the new
length (an independent reference: transformers' own classes, the table tiled in the test); and LED's step, a BART
extended to 4096 by copy, reloaded without posswap, generating the stock model's tokens."""

from __future__ import annotations

import copy
import json
import pickle
import threading

import pytest
import torch
import transformers
from conftest import (
    FACTORIES,
    OLD_LENGTH,
    TINY_CONFIGS,
    make_model,
    run_without_posswap,
    sharpen_qk,
    token_ids,
)
from peft import LoraConfig, get_peft_model

import posswap
from posswap.methods.backends import installs_attention
from posswap.portable.posswap_architectures import ARCHITECTURES, find_stacks
from posswap.registry import METHODS

NEW_LENGTH = 4 * OLD_LENGTH
HEADS = {
    "opt": "OPTForCausalLM",
    "gpt_neo": "GPTNeoForCausalLM",
    "bart": "BartForConditionalGeneration",
    "mbart": "MBartForConditionalGeneration",
}


def runs(method: str, model_type: str) -> bool:
    return not (ARCHITECTURES[model_type].own_attention and installs_attention(METHODS[method].config_class))


def patched(method: str, model_type: str):
    return posswap.patch(sharpen_qk(make_model(model_type, HEADS[model_type])), FACTORIES[method](NEW_LENGTH)).eval()


OPT_METHODS = [m for m in FACTORIES if m != "nope"]  # NoPE: a left pad cannot move what has no position


@pytest.mark.parametrize("method", OPT_METHODS)
def test_opt_numbers_real_tokens_so_a_left_padded_row_equals_it_alone(method):
    """OPT's ids come from the attention mask (a left-padded row starts at 0), and posswap's kernels read them: the
    padded row's logits equal the row run alone, on its real tokens."""
    model = patched(method, "opt")
    ids = token_ids(40)
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    with torch.no_grad():
        batch = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=ids[1:, 9:]).logits
    torch.testing.assert_close(batch[1:, 9:], alone, atol=1e-4, rtol=1e-4)


DECODERS = [(m, t) for t in ("opt", "gpt_neo") for m in FACTORIES if runs(m, t)]


@pytest.mark.parametrize("method,model_type", DECODERS, ids=[f"{m}-{t}" for m, t in DECODERS])
def test_decoding_through_the_cache_equals_one_full_pass(method, model_type):
    """Past the old length: a prompt, then one token at a time through the KV cache, equals one full pass."""
    model = patched(method, model_type)
    ids = token_ids(OLD_LENGTH + 20)
    with torch.no_grad():
        out = model(input_ids=ids[:, : OLD_LENGTH - 4], use_cache=True)
        steps = [out.logits]
        for i in range(OLD_LENGTH - 4, ids.shape[1]):
            out = model(input_ids=ids[:, i : i + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
        full = model(input_ids=ids).logits
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


ENCODER_DECODERS = [(m, t) for t in ("bart", "mbart") for m in FACTORIES]


@pytest.mark.parametrize("method,model_type", ENCODER_DECODERS, ids=[f"{m}-{t}" for m, t in ENCODER_DECODERS])
def test_encoder_decoder_decoding_through_the_cache_equals_one_full_pass(method, model_type):
    """Both stacks patched: a long encoder input and a decoder run past the old length, step by step through the
    cache (self-attention cached, cross-attention computed once), equal one full pass."""
    model = patched(method, model_type)
    source, target = token_ids(NEW_LENGTH - 8), token_ids(OLD_LENGTH + 12, seed=2)
    with torch.no_grad():
        encoded = model.get_encoder()(input_ids=source)
        out = model(encoder_outputs=encoded, decoder_input_ids=target[:, :5], use_cache=True)
        steps = [out.logits]
        for i in range(5, target.shape[1]):
            step = target[:, i : i + 1]
            out = model(encoder_outputs=encoded, decoder_input_ids=step, past_key_values=out.past_key_values)
            steps.append(out.logits)
        full = model(input_ids=source, decoder_input_ids=target).logits
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-4, rtol=1e-4)


def _stock_at_new_length(model_type: str, patched_model):
    """transformers' own model built at NEW_LENGTH with the patched model's weights (its tables included)."""
    config = TINY_CONFIGS[model_type]()
    config.max_position_embeddings = NEW_LENGTH
    stock = getattr(transformers, HEADS[model_type])(config).eval()
    stock.load_state_dict(patched_model.state_dict())
    return stock


def _tiled(table: torch.Tensor, inner: int) -> torch.Tensor:
    """The copy mode by hand: the rows before position 0 kept, the old positions repeated to NEW_LENGTH."""
    rows = table[inner:]
    return torch.cat([table[:inner], rows.repeat(NEW_LENGTH // len(rows), 1)])


@pytest.mark.parametrize("model_type", list(HEADS))
def test_copy_extension_equals_the_stock_model_built_at_the_new_length(model_type):
    """Every table tiled by hand equals posswap's (OPT's and BART's 2 rows before position 0 kept), and the patched
    model equals transformers' own class built at NEW_LENGTH (GPT-Neo: its causal masks rebuilt there, the local
    layer's window kept)."""
    stock = sharpen_qk(make_model(model_type, HEADS[model_type]))
    old_tables = [sites.table.weight.detach().clone() for sites in find_stacks(stock)]
    model = posswap.patch(stock, posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="copy"))
    inner = ARCHITECTURES[model_type].inner_offset
    for sites, old in zip(find_stacks(model), old_tables, strict=True):
        torch.testing.assert_close(sites.table.weight.detach(), _tiled(old, inner), atol=0, rtol=0)
    reference = _stock_at_new_length(model_type, model)
    for mine, theirs in zip(model.modules(), reference.modules(), strict=True):
        if type(theirs).__name__ == "GPTNeoSelfAttention":  # its causal mask at the new length
            assert torch.equal(mine.bias, theirs.bias)
    ids = token_ids(NEW_LENGTH)
    kwargs = {"decoder_input_ids": token_ids(NEW_LENGTH, seed=3)} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids, **kwargs).logits, reference(input_ids=ids, **kwargs).logits)


@pytest.mark.parametrize("model_type", ["opt", "bart"])
def test_lora_adapts_the_listed_projections(model_type):
    model = patched("rope", model_type)
    targets = list(ARCHITECTURES[model_type].lora_targets)
    ids = token_ids(NEW_LENGTH)
    with torch.no_grad():
        before = model(input_ids=ids).logits  # get_peft_model wraps the model's own modules: read them first
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=targets, lora_dropout=0.0))
    adapted = {name.rsplit(".", 1)[-1] for name, _ in lora.named_modules() if name.endswith(tuple(targets))}
    assert adapted == set(targets)
    with torch.no_grad():
        torch.testing.assert_close(lora(input_ids=ids).logits, before)  # B = 0: unchanged


GENERATE = """
import json, sys
import torch, transformers
job = json.loads(open(sys.argv[1]).read())
model = transformers.AutoModelForSeq2SeqLM.from_pretrained(job["folder"]).eval()
with torch.no_grad():
    out = model.generate(torch.tensor(job["ids"]), max_new_tokens=12, do_sample=False, num_beams=1)
job["tokens"], job["class"] = out.tolist(), type(model).__name__
job["rows"] = model.model.encoder.embed_positions.weight.shape[0]
open(sys.argv[1], "w").write(json.dumps(job))
"""


def test_bart_extended_by_copy_generates_the_stock_tokens_after_reloading_without_posswap(tmp_path):
    """LED's step: BART's 1024 positions copied to 4096 in both tables, saved as a plain BART folder (a resized
    table is native), loaded by transformers alone, generates for a 1000-token input exactly the stock model's
    greedy tokens."""
    config = TINY_CONFIGS["bart"]()
    config.max_position_embeddings = 1024
    torch.manual_seed(0)
    stock = sharpen_qk(transformers.BartForConditionalGeneration(config).eval())
    ids = token_ids(1000, batch=1, seed=4)
    with torch.no_grad():
        expected = stock.generate(ids, max_new_tokens=12, do_sample=False, num_beams=1)
    model = posswap.patch(stock, posswap.InterpolateConfig(max_length=4096, mode="copy"))
    model.save_pretrained(tmp_path / "bart-4k")
    assert json.loads((tmp_path / "bart-4k" / "config.json").read_text())["model_type"] == "bart"
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"folder": str(tmp_path / "bart-4k"), "ids": ids.tolist()}))
    run_without_posswap(GENERATE, str(job), modules=tmp_path / "modules")
    result = json.loads(job.read_text())
    assert result["class"] == "BartForConditionalGeneration" and result["rows"] == 4096 + 2
    assert result["tokens"] == expected.tolist()
    with pytest.raises(ValueError, match="reads at most 4096 tokens"):
        model(input_ids=token_ids(4097, batch=1), decoder_input_ids=ids[:, :4])


@pytest.mark.parametrize("method,model_type", [("rope", "opt"), ("alibi", "bart"), ("sinusoidal", "gpt_neo")])
def test_a_patched_model_deepcopies_pickles_and_serves_threads(method, model_type):
    """A drop-in model: a deepcopy and a pickled copy give the same outputs, and four threads at once each get what
    their input gives alone (each call's state is its own, on every stack)."""
    model = patched(method, model_type)
    inputs = [token_ids(OLD_LENGTH + 8 * i, seed=i) for i in range(4)]
    with torch.no_grad():
        alone = [model(input_ids=ids).logits for ids in inputs]
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            torch.testing.assert_close(other(input_ids=inputs[0]).logits, alone[0], atol=0, rtol=0)
    together = [None] * len(inputs)

    def run(i):
        with torch.no_grad():
            together[i] = model(input_ids=inputs[i]).logits

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for got, expected in zip(together, alone, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_an_encoder_decoder_has_no_onnx_graph_and_says_so():
    pytest.importorskip("onnx")
    from posswap.onnx.graph import onnx_refusal

    model = patched("interpolate", "bart")
    assert "bart is an encoder-decoder" in onnx_refusal(model) and "\n" not in onnx_refusal(model)
    assert onnx_refusal(patched("interpolate", "opt")) is None  # a resized table: native, as GPT-2's
