"""More of the blocked CPU path of the bias methods (``portable/posswap_blocked.py``), issue 28: ``head_mask`` is
treated as stock transformers treats it, ``train()`` with dropout 0 gives ``eval()``'s output, GPT-2 batches of
different lengths (left padding) agree with the dense path and with each sequence alone; and T5-bias / TUPE
sentence-transformers models (the real MiniLM) encode what the transformer, mean pooling and normalisation give
by hand, patched in memory, loaded with posswap.from_pretrained and with ``trust_remote_code=True``. Last, a bias
model's forward logs no deprecation warning about an argument its caller never passed.
"""

from __future__ import annotations

import inspect
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model, run_without_posswap, sharpen_qk, token_ids
from safetensors.torch import load_file
from test_blocked_attention import (
    METHODS,
    TOLERANCE,
    both,
    first,
    patched,
    routes,  # noqa: F401  (fixture)
)

import posswap
from posswap.data import read_document
from posswap.portable import posswap_attention, posswap_blocked

# --- head_mask -------------------------------------------------------------------------------------------------


def stock_ignores_head_mask(head_mask) -> bool:
    """What transformers itself does with ``head_mask`` on the model posswap patches (transformers 5 dropped the
    argument: it lands in ``**kwargs`` and nothing reads it); within the stock table's 32 positions."""
    stock = sharpen_qk(make_model("bert", "BertModel"))
    ids = token_ids(24)
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    with torch.no_grad():
        plain = stock(input_ids=ids, attention_mask=mask).last_hidden_state
        masked = stock(input_ids=ids, attention_mask=mask, head_mask=head_mask).last_hidden_state
    return torch.equal(masked, plain)


@pytest.mark.parametrize("shape", ["heads", "layers x heads"])
@pytest.mark.parametrize("method", METHODS)
def test_head_mask_is_treated_on_both_paths_as_stock_treats_it(monkeypatch, routes, method, shape):  # noqa: F811
    """Stock ignores ``head_mask``: the patched model, dense and blocked, gives the output it gives without one. If
    transformers honoured it again, posswap would have to honour it on both paths or refuse it naming it."""
    ids = token_ids(40)
    mask = torch.ones_like(ids)
    mask[1, -7:] = 0
    head_mask = torch.ones(4) if shape == "heads" else torch.ones(2, 4)
    head_mask[..., 1] = 0.0  # head 1 off (in every layer)
    model = patched("bert", method)
    plain_dense, plain_blocked = both(monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask)))
    runs = dict(routes.counts)
    assert runs["fast"] > 0  # the blocked run really was blocked (right padding: the fast route)
    real = mask.bool()
    if stock_ignores_head_mask(head_mask):
        dense, blocked = both(
            monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask, head_mask=head_mask))
        )
        assert torch.equal(dense, plain_dense) and torch.equal(blocked, plain_blocked)
        assert routes.counts["fast"] == 2 * runs["fast"]  # with head_mask the blocked path still ran
        torch.testing.assert_close(blocked[real], dense[real], **TOLERANCE)
        return
    try:  # transformers honours head_mask: so must posswap, on both paths, or refuse it
        dense, blocked = both(
            monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask, head_mask=head_mask))
        )
    except ValueError as error:
        assert "head_mask" in str(error)
    else:
        torch.testing.assert_close(blocked[real], dense[real], **TOLERANCE)
        assert not torch.allclose(dense[real], plain_dense[real], atol=1e-4)


# --- train() and eval() ----------------------------------------------------------------------------------------


def no_dropout(model):
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    for name in ("attention_probs_dropout_prob", "hidden_dropout_prob", "attn_pdrop", "resid_pdrop", "embd_pdrop"):
        if hasattr(model.config, name):
            setattr(model.config, name, 0.0)
    return model


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model_type", ["gpt2", "bert"])
def test_train_mode_with_dropout_zero_gives_the_eval_output(monkeypatch, routes, model_type, method):  # noqa: F811
    """Inference in train() (no gradient, dropout 0) takes the blocked path as eval() does, with the same output,
    which is the dense path's; with padding too (left for GPT-2, right for BERT)."""
    model = no_dropout(patched(model_type, method))
    ids = token_ids(40)
    mask = torch.ones_like(ids)
    if model_type == "gpt2":
        mask[1, :9] = 0
    else:
        mask[1, -9:] = 0
    real = mask.bool()
    for kwargs in (dict(input_ids=ids), dict(input_ids=ids, attention_mask=mask)):
        results = {}
        for mode in ("eval", "train"):
            getattr(model, mode)()
            before = sum(routes.counts.values())
            results[mode] = both(monkeypatch, lambda k=kwargs: first(model(**k)))
            assert sum(routes.counts.values()) == before + 2, mode  # the blocked run took the blocked path
        keep = real if "attention_mask" in kwargs else torch.ones_like(real)
        (eval_dense, eval_blocked), (train_dense, train_blocked) = results["eval"], results["train"]
        assert torch.equal(train_blocked[keep], eval_blocked[keep])
        assert torch.equal(train_dense[keep], eval_dense[keep])
        torch.testing.assert_close(train_blocked[keep], eval_dense[keep], **TOLERANCE)
    assert model.training  # left in train mode: nothing switched it


# --- GPT-2, left padding ---------------------------------------------------------------------------------------

LENGTHS = (40, 33, 21)  # one batch, padded on the left to 40


def gpt2_patched(method: str):
    """``patched``, with TUPE's table scaled up: a tiny GPT-2's table (std 0.02) makes its absolute term ~1e-5."""
    model = patched("gpt2", method)
    with torch.no_grad():
        for provider in model.base_model.posswap_bias_providers.modules():
            if hasattr(provider, "positions"):
                provider.positions.mul_(30)
    return model


def left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    ids = token_ids(max(LENGTHS), batch=len(LENGTHS), seed=5)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        mask[row, -length:] = 1
        ids[row, :-length] = 0  # what a tokenizer puts there; masked
    return ids, mask


@pytest.mark.parametrize("ids_from", ["implicit", "mask"])
@pytest.mark.parametrize("method", METHODS)
def test_gpt2_left_padding_of_different_lengths_blocked_equals_dense(monkeypatch, routes, method, ids_from):  # noqa: F811
    """Three sequences of 40, 33 and 21 tokens, left-padded: the blocked path gives the dense path's logits on every
    real token (1e-5), with implicit ids and with generate's ids from the mask. With ids from the mask every
    sequence reads its tokens from position 0, so each also equals that sequence alone (no padding); with implicit
    ids only a relative bias (ALiBi, T5) is blind to the shift the padding makes."""
    model = gpt2_patched(method)
    ids, mask = left_padded()
    positions = None if ids_from == "implicit" else (mask.cumsum(-1) - 1).clamp(min=0)
    dense, blocked = both(monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask, position_ids=positions)))
    assert routes.counts["general"] == 2  # left padding: the general route, once per layer
    real = mask.bool()
    torch.testing.assert_close(blocked[real], dense[real], atol=1e-5, rtol=0)
    assert (dense[0, -1] - dense[0, -2]).abs().max() > 1e-3  # sanity: the logits differ from token to token
    if ids_from == "implicit" and method == "tupe-r":  # absolute positions: the padding moved them
        return
    for row, length in enumerate(LENGTHS):
        alone_dense, alone_blocked = both(
            monkeypatch, lambda r=row, n=length: first(model(input_ids=ids[r : r + 1, -n:]))
        )
        torch.testing.assert_close(blocked[row, -length:], alone_dense[0], atol=1e-5, rtol=0)
        torch.testing.assert_close(alone_blocked, alone_dense, atol=1e-5, rtol=0)


def test_gpt2_left_padding_shifts_what_an_absolute_method_reads(monkeypatch, routes):  # noqa: F811
    """The test above is not blind: TUPE's absolute term does see the shift of implicit ids under left padding."""
    model = gpt2_patched("tupe-r")
    ids, mask = left_padded()
    _, blocked = both(monkeypatch, lambda: first(model(input_ids=ids, attention_mask=mask)))
    _, alone = both(monkeypatch, lambda: first(model(input_ids=ids[2:, -LENGTHS[2] :])))
    assert (blocked[2, -LENGTHS[2] :] - alone[0]).abs().max() > 1e-3


# --- sentence-transformers: T5 bias and TUPE through encode ----------------------------------------------------

NEW = 1024
ST_METHODS = {
    "t5-bias": lambda: posswap.T5BiasConfig(max_length=NEW),
    "tupe": lambda: posswap.TupeConfig(max_length=NEW),
    "tupe-r": lambda: posswap.TupeConfig(max_length=NEW, relative=True),
}

# Where posswap cannot be imported: each folder through SentenceTransformer(folder, trust_remote_code=True), its
# embeddings from encode and, by hand, from its transformer called directly (the same by_hand as here).
REMOTE = """
import json, sys
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from sentence_transformers import SentenceTransformer
{by_hand}
jobs = json.loads(sys.argv[1])
for job in jobs:
    model = SentenceTransformer(job["folder"], device="cpu", trust_remote_code=True)
    job["class"] = type(model[0].auto_model).__module__ + "." + type(model[0].auto_model).__name__
    job["max_seq_length"] = model.max_seq_length
    tensors = {{
        "encode": model.encode(job["texts"], convert_to_tensor=True, batch_size=2),
        "by_hand": by_hand(model, job["texts"]),
    }}
    save_file({{k: v.contiguous() for k, v in tensors.items()}}, job["out"])
print(json.dumps(jobs))
"""


def by_hand(model, texts):
    """The reference: the transformer called directly on the tokenized batch, then mean pooling over the real
    tokens and L2 normalisation, computed here (all-MiniLM-L6-v2: Transformer, mean Pooling, Normalize)."""
    assert [type(m).__name__ for m in model] == ["Transformer", "Pooling", "Normalize"], list(model)
    assert model[1].get_config_dict()["pooling_mode"] == "mean"
    module = model[0]
    batch = module.tokenizer(texts, padding=True, truncation=True, max_length=model.max_seq_length, return_tensors="pt")
    with torch.no_grad():
        tokens = module.auto_model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).to(tokens.dtype)
    return F.normalize((tokens * weights).sum(1) / weights.sum(1), p=2, dim=-1)


def texts(tokenizer) -> list[str]:
    """Four texts of very different lengths, one past MiniLM's 512 positions."""
    ids = tokenizer(read_document("persuasion")[:12000], add_special_tokens=False, verbose=False).input_ids
    return [
        "A short sentence about Anne Elliot.",
        tokenizer.decode(ids[:540]),
        tokenizer.decode(ids[1000:1090]),
        tokenizer.decode(ids[1500:1700]),
    ]


def encode(model, batch_texts: list[str]) -> torch.Tensor:
    """Batches of two (sentence-transformers sorts by length): padded otherwise than the reference's one batch."""
    return model.encode(batch_texts, convert_to_tensor=True, batch_size=2)


@pytest.fixture(scope="module")
def patched_st(minilm_path, tmp_path_factory):
    """MiniLM patched with each method (buckets given values: they start at zero) and saved with ``save``; the
    texts, and the reference embeddings of the patched model (by hand)."""
    st = pytest.importorskip("sentence_transformers")
    root = tmp_path_factory.mktemp("st-bias")
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    batch_texts = texts(stock.tokenizer)
    cases = {}
    for name, config in ST_METHODS.items():
        model = posswap.patch(st.SentenceTransformer(minilm_path, device="cpu"), config())
        assert model.max_seq_length == NEW
        with torch.no_grad():
            for provider in model[0].auto_model.base_model.posswap_bias_providers.modules():
                if hasattr(provider, "relative_attention_bias"):
                    provider.relative_attention_bias.weight.normal_(0, 1, generator=torch.Generator().manual_seed(3))
        model.save(str(root / name))
        cases[name] = {"model": model, "folder": root / name, "reference": by_hand(model, batch_texts)}
    assert len(stock.tokenizer(batch_texts[1]).input_ids) > 512  # read whole by the patched models only
    return {"st": st, "stock": stock, "texts": batch_texts, "cases": cases, "root": root}


@pytest.mark.parametrize("method", ST_METHODS)
def test_sentence_transformer_encode_equals_transformer_pooling_and_normalising_by_hand(patched_st, method):
    case = patched_st["cases"][method]
    torch.testing.assert_close(encode(case["model"], patched_st["texts"]), case["reference"], atol=1e-5, rtol=0)
    # What is encoded is the patched model: the short text (which stock reads whole too) gets another embedding.
    stock = patched_st["stock"].encode(patched_st["texts"][:1], convert_to_tensor=True)[0]
    assert (case["reference"][0] - stock).abs().max() > 1e-3


@pytest.mark.parametrize("method", ST_METHODS)
def test_saved_sentence_transformer_loaded_by_posswap_encodes_as_by_hand(patched_st, method):
    case, batch_texts = patched_st["cases"][method], patched_st["texts"]
    loaded = posswap.from_pretrained(str(case["folder"]))
    assert type(loaded) is patched_st["st"].SentenceTransformer and loaded.max_seq_length == NEW
    reference = by_hand(loaded, batch_texts)
    torch.testing.assert_close(encode(loaded, batch_texts), reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(reference, case["reference"], atol=1e-5, rtol=0)


def test_saved_sentence_transformers_with_trust_remote_code_encode_as_by_hand(patched_st):
    """``SentenceTransformer(folder, trust_remote_code=True)`` where posswap cannot be imported (the code saved
    beside the weights runs), every method in one subprocess."""
    root, batch_texts = patched_st["root"], patched_st["texts"]
    jobs = [
        {"name": name, "folder": str(case["folder"]), "texts": batch_texts, "out": str(root / f"{name}.safetensors")}
        for name, case in patched_st["cases"].items()
    ]
    script = REMOTE.format(by_hand=inspect.getsource(by_hand))
    stdout = run_without_posswap(script, json.dumps(jobs), modules=root / "modules")
    for job in json.loads(stdout.strip().splitlines()[-1]):
        expected = patched_st["cases"][job["name"]]["reference"]
        assert job["class"].startswith("transformers_modules.") and ".Posswap" in job["class"], job["class"]
        assert job["max_seq_length"] == NEW
        got = load_file(job["out"])
        torch.testing.assert_close(got["encode"], got["by_hand"], atol=1e-5, rtol=0)
        torch.testing.assert_close(got["by_hand"], expected, atol=1e-5, rtol=0)


def test_the_blocked_path_serves_the_long_encode(patched_st, monkeypatch):
    """The encode above is long enough for the blocked path (default BLOCK_BYTES) and equals the dense one."""
    model, batch_texts = patched_st["cases"]["t5-bias"]["model"], patched_st["texts"]
    seen = []
    original = posswap_blocked.wanted

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(posswap_attention, "wanted", spy)
    blocked = encode(model, batch_texts)
    assert any(seen)
    monkeypatch.setattr(posswap_blocked, "BLOCK_BYTES", 2**62)
    seen.clear()
    dense = encode(model, batch_texts)
    assert seen and not any(seen)
    torch.testing.assert_close(blocked, dense, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", ["bert", "gpt2"])
def test_a_bias_model_forward_logs_no_deprecation_it_did_not_cause(monkeypatch, model_type):
    """posswap's hook that keeps the key positions on the returned cache once read ``output.past_key_values``, the
    old name transformers 5.24 warns about: every first forward of an encoder (no cache) logged "past_key_values
    ... deprecated" although the caller never named it."""
    import transformers.utils.generic as generic

    logged = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda *args, **kwargs: logged.append(args))
    model = patched(model_type, "t5-bias")
    ids = token_ids(20)
    with torch.no_grad():
        model(input_ids=ids)
        model(input_ids=ids, use_cache=False)
        model(input_ids=ids, return_dict=False)
        if model_type == "gpt2":  # the cache still gets its key positions: decoding equals the full pass
            out = model(input_ids=ids[:, :12], use_cache=True)
            step = model(input_ids=ids[:, 12:], cache=out.cache)
            torch.testing.assert_close(step.logits, model(input_ids=ids).logits[:, 12:], atol=1e-5, rtol=0)
    assert not [args for args in logged if "deprecated" in str(args)], logged
