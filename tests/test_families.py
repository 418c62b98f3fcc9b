"""The families added to MODELS' (issue 61: camembert, distilbert, albert, mpnet), one head each, through every
method: round trip, too long input, short inputs equal to stock where a method promises it, the caller's position_ids
reaching the attention, gradient checkpointing, loading without posswap, native export; the attention methods refused
where a family computes attention in its own module (mpnet), the model untouched; and the families posswap does not
support yet still refused in one line.

A module of its own (not MODELS) so that the whole suite does not run every test once more per family."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import transformers
from conftest import (
    FACTORIES,
    FAMILIES,
    OLD_LENGTH,
    TINY_CONFIGS,
    assert_untouched,
    make_model,
    outputs,
    padded_mask,
    reload_and_compare,
    run_without_posswap,
    sharpen_qk,
    snapshot,
    token_ids,
)
from safetensors.torch import load_file

import posswap
from posswap.methods.backends import installs_attention
from posswap.onnx.encoder import PADDING_OFFSET_TYPES
from posswap.portable.posswap_architectures import ARCHITECTURES, NOT_YET
from posswap.registry import METHODS

NEW_LENGTH = 4 * OLD_LENGTH


def patched(method: str | posswap.InterpolateConfig, model_type: str, head: str):
    config = FACTORIES[method](NEW_LENGTH) if isinstance(method, str) else method
    return posswap.patch(sharpen_qk(make_model(model_type, head)), config).eval()


def refused(method: str, model_type: str) -> bool:
    """A method that installs its own attention kernel, on a family whose attention is its own module's (mpnet)."""
    return bool(ARCHITECTURES[model_type].own_attention) and installs_attention(METHODS[method].config_class)


# (method, model_type, head): every method on every family, split into those that run and those refused.
CASES = [(method, model_type, head) for method in FACTORIES for model_type, head in FAMILIES]
RUN = [case for case in CASES if not refused(*case[:2])]
REFUSED = [case for case in CASES if refused(*case[:2])]


def case_id(case) -> str:
    return f"{case[0]}-{case[1]}"


@pytest.mark.parametrize("method,model_type,head", RUN, ids=[case_id(c) for c in RUN])
def test_round_trip_and_too_long_input(method, model_type, head, tmp_path):
    model = reload_and_compare(patched(method, model_type, head), tmp_path, NEW_LENGTH)
    assert model.config.max_position_embeddings - ARCHITECTURES[model_type].offset(model.config) == NEW_LENGTH
    with pytest.raises(ValueError, match=f"reads at most {NEW_LENGTH} tokens"):
        outputs(model, token_ids(NEW_LENGTH + 1))


@pytest.mark.parametrize("method,model_type,head", REFUSED, ids=[case_id(c) for c in REFUSED])
def test_attention_methods_are_refused_where_the_family_computes_its_own(method, model_type, head):
    """MPNet's attention is its own module's (with its own relative bias, and no positions handed to it): rope,
    alibi, t5-bias and tupe are refused in one line naming family, method and what to use, the model untouched."""
    model = sharpen_qk(make_model(model_type, head))
    before = snapshot(model)
    with pytest.raises(ValueError, match=f"cannot patch {model_type} .* with {method}: .*own module") as error:
        posswap.patch(model, FACTORIES[method](NEW_LENGTH))
    assert "\n" not in str(error.value) and "Use interpolate" in str(error.value)
    assert_untouched(model, before)
    assert not hasattr(model.config, "posswap")


# The shipped MiniLM recipes' placement (recipes/minilm-late-2k.yaml's posswap block, at this length).
RECIPE_PLACEMENT = posswap.InterpolateConfig(
    max_length=NEW_LENGTH, mode="stride", exact_short_inputs=True, stride_per_length=True, stride_blocks=2
)
SHORT_EXACT = {
    "copy": posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="copy"),
    "stride-exact": posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="stride", exact_short_inputs=True),
    "stride-recipe": RECIPE_PLACEMENT,
}


# exact_short_inputs is for encoders: a decoder's tokens would move as generation crosses the old length.
SHORT_CASES = [
    (name, model_type, head)
    for name in SHORT_EXACT
    for model_type, head in FAMILIES
    if name == "copy" or not ARCHITECTURES[model_type].causal
]


@pytest.mark.parametrize("name,model_type,head", SHORT_CASES, ids=[f"{c[0]}-{c[1]}" for c in SHORT_CASES])
def test_short_inputs_give_the_stock_outputs(name, model_type, head):
    config = SHORT_EXACT[name]
    stock = sharpen_qk(make_model(model_type, head))
    model = posswap.patch(copy.deepcopy(stock), config)
    ids = token_ids(OLD_LENGTH)
    mask = padded_mask(ids, model_type, 6)
    with torch.no_grad():
        for length in (5, OLD_LENGTH):
            expected = stock.base_model(input_ids=ids[:, :length], attention_mask=mask[:, :length])
            got = model.base_model(input_ids=ids[:, :length], attention_mask=mask[:, :length])
            torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=0)
        longer = model.base_model(input_ids=token_ids(NEW_LENGTH)).last_hidden_state
    assert torch.isfinite(longer).all()


# BART's stacks take no position_ids (each numbers its tokens itself).
ATTENTION_CASES = [case for case in RUN if case[0] in ("rope", "alibi") and not ARCHITECTURES[case[1]].encoder_decoder]


@pytest.mark.parametrize("method,model_type,head", ATTENTION_CASES, ids=[case_id(c) for c in ATTENTION_CASES])
def test_explicit_position_ids_reach_the_attention(method, model_type, head):
    """Tokens at positions 0, 2, 4, ... given as position_ids equal the same tokens with a masked filler token
    between each two, at positions 0..23: DistilBERT gives the caller's ids to its embeddings only (posswap carries
    them down); OPT numbers the real tokens of a masked row 0..11 itself, so the spread row's ids are given too."""
    model = patched(method, model_type, head)
    ids, offset = token_ids(12), ARCHITECTURES[model_type].offset(model.config)
    spread = torch.full((2, 24), 7)
    spread[:, ::2] = ids
    mask = torch.zeros_like(spread)
    mask[:, ::2] = 1
    positions = (2 * torch.arange(12) + offset)[None].expand(2, -1)
    every = (torch.arange(24) + offset)[None].expand(2, -1)
    with torch.no_grad():
        expected = model.base_model(input_ids=spread, attention_mask=mask, position_ids=every).last_hidden_state[:, ::2]
        got = model.base_model(input_ids=ids, position_ids=positions).last_hidden_state
        default = model.base_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (default - got).abs().max() > 1e-3  # the ids were read: the default 0..11 give other outputs


# ALBERT has none: transformers refuses gradient checkpointing for it ("does not support activation checkpointing").
CHECKPOINTED = {"camembert": "t5-bias", "distilbert": "rope", "opt": "alibi", "gpt_neo": "sinusoidal", "bart": "tupe"}


def _gradients(model, ids, mask) -> dict[str, torch.Tensor | None]:
    model.zero_grad(set_to_none=True)
    outputs_ = model(input_ids=ids, attention_mask=mask)
    outputs_.logits.pow(2).mean().backward()
    return {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("model_type,head", [f for f in FAMILIES if f[0] in CHECKPOINTED], ids=list(CHECKPOINTED))
def test_gradient_checkpointing_gives_the_plain_gradients(model_type, head):
    model = patched(CHECKPOINTED[model_type], model_type, head)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    model.train()
    ids = token_ids(24)
    mask = padded_mask(ids, model_type, 5)
    plain = _gradients(model, ids, mask)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    checkpointed = _gradients(model, ids, mask)
    assert [n for n, g in plain.items() if g is None] == [n for n, g in checkpointed.items() if g is None]
    for name, grad in plain.items():
        if grad is not None:
            torch.testing.assert_close(
                checkpointed[name], grad, atol=1e-6, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}"
            )


def _copy_shared_layer(shared, separate) -> None:
    weights = shared.state_dict()
    group = "albert_layer_groups.1."
    separate.load_state_dict({k: weights[k.replace(group, "albert_layer_groups.0.")] for k in separate.state_dict()})


@pytest.mark.parametrize("method", FACTORIES)
def test_albert_shared_layer_equals_two_equal_layers(method):
    """ALBERT runs its one layer module at every depth: patched, it must equal an ALBERT with two layer modules of
    the same weights (each hooked once), so nothing a method hooks on the shared module applies twice per call."""
    stock = sharpen_qk(make_model("albert", "AlbertForMaskedLM"))
    config = TINY_CONFIGS["albert"]()
    config.num_hidden_groups = 2
    separate = transformers.AlbertForMaskedLM(config).eval()
    _copy_shared_layer(stock, separate)  # the same weights before patching: what patch reads from them agrees
    shared = posswap.patch(stock, FACTORIES[method](NEW_LENGTH))
    separate = posswap.patch(separate, FACTORIES[method](NEW_LENGTH))
    _copy_shared_layer(shared, separate)  # and what a method adds (T5's buckets, TUPE's projections)
    assert len(shared.albert.encoder.albert_layer_groups) == 1
    ids = token_ids(NEW_LENGTH)
    torch.testing.assert_close(outputs(shared, ids), outputs(separate, ids), atol=1e-5, rtol=1e-5)


# model_type -> (method or config, Auto class) of the folder loaded without posswap.
REMOTE = {
    "camembert": ("rope", "AutoModelForMaskedLM"),
    "distilbert": ("alibi", "AutoModelForSequenceClassification"),
    "albert": ("tupe", "AutoModelForMaskedLM"),
    "mpnet": (RECIPE_PLACEMENT, "AutoModelForMaskedLM"),  # the placement's code travels with the folder
    "opt": ("rope", "AutoModelForCausalLM"),
    "gpt_neo": ("nope", "AutoModelForCausalLM"),
    "bart": ("alibi", "AutoModelForSeq2SeqLM"),
    "mbart": ("t5-bias", "AutoModelForSeq2SeqLM"),
}
LOADER = """
import json, sys
import torch, transformers
from safetensors.torch import save_file
jobs = json.loads(open(sys.argv[1]).read())
for job in jobs:
    model = getattr(transformers, job["auto"]).from_pretrained(job["source"], trust_remote_code=True).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor(job["ids"]), attention_mask=torch.tensor(job["mask"]))
    save_file({"logits": out.logits.contiguous()}, job["out"])
    job["class"] = type(model).__name__
open(sys.argv[1], "w").write(json.dumps(jobs))
"""


def test_saved_folders_load_without_posswap(tmp_path):
    jobs, expected = [], {}
    for model_type, head in FAMILIES:
        method, auto = REMOTE[model_type]
        model = patched(method, model_type, head)
        model.save_pretrained(tmp_path / model_type)
        ids = token_ids(40, seed=5)
        mask = padded_mask(ids, model_type, 7)
        with torch.no_grad():
            expected[model_type] = model(input_ids=ids, attention_mask=mask).logits
        job = dict(source=str(tmp_path / model_type), auto=auto, ids=ids.tolist(), mask=mask.tolist())
        jobs.append({**job, "type": model_type, "out": str(tmp_path / f"{model_type}.safetensors")})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    run_without_posswap(LOADER, str(tmp_path / "jobs.json"), modules=tmp_path / "modules")
    for job in json.loads((tmp_path / "jobs.json").read_text()):
        assert job["class"] == "Posswap" + dict(FAMILIES)[job["type"]]
        torch.testing.assert_close(load_file(job["out"])["logits"], expected[job["type"]], atol=1e-5, rtol=1e-5)


def test_camembert_rope_exports_to_roformer(tmp_path):
    model = patched("rope", "camembert", "CamembertForMaskedLM")
    result = posswap.export(model, tmp_path / "native")
    assert result.architecture == "RoFormerForMaskedLM" and result.max_difference < 1e-4
    native = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "native").eval()
    ids = token_ids(NEW_LENGTH)
    torch.testing.assert_close(outputs(native, ids), outputs(model, ids), atol=1e-4, rtol=0)


# mpnet, gpt_neo: rope itself is refused.
NO_NATIVE = [f for f in FAMILIES if f[0] in ("distilbert", "albert", "opt", "bart", "mbart")]


@pytest.mark.parametrize("model_type,head", NO_NATIVE, ids=[f[0] for f in NO_NATIVE])
def test_families_without_a_native_rope_model_refuse_export_in_one_line(model_type, head, tmp_path):
    model = patched("rope", model_type, head)
    with pytest.raises(ValueError, match=f"No exact native export for {head}: .*{model_type}") as error:
        posswap.export(model, tmp_path / "native")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "native").exists()


def test_onnx_encoder_knows_every_padding_offset():
    """onnx_encoder runs without torch, so it names the families with RoBERTa's offset itself: the same ones."""
    for model_type, arch in ARCHITECTURES.items():
        config = TINY_CONFIGS[model_type]()
        expected = config.pad_token_id + 1 if model_type in PADDING_OFFSET_TYPES else 0
        assert arch.offset(config) == expected, model_type


def test_a_family_outside_the_table_is_refused_in_one_line():
    """BioGPT has a learned table too (offset 2, like OPT's) but no entry: refused naming it and the supported
    types, the model untouched."""
    model = transformers.BioGptForCausalLM(
        transformers.BioGptConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
    )  # fmt: skip
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="does not support model_type 'biogpt'") as error:
        posswap.patch(model, posswap.RopeConfig(max_length=NEW_LENGTH))
    assert "\n" not in str(error.value) and ", ".join(sorted(ARCHITECTURES)) in str(error.value)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_the_readme_and_the_docs_list_the_families_of_the_architecture_table():
    """Generated, not typed: the README's line is current (python -m posswap.cli.generate --write) and the docs page
    fills its table from the same entries, refused families with their reason."""
    from posswap.cli.generate import README, render_readme
    from posswap.methods.architectures import families_table

    assert README.read_text(encoding="utf-8") == render_readme()
    table = families_table()
    assert all(f"| `{name}` |" in table for name in ARCHITECTURES)
    assert all(f"- `{name}`: {why}." in table for name, why in NOT_YET.items())
    assert "<!-- posswap:families -->" in (README.parent / "docs" / "families.md").read_text(encoding="utf-8")
