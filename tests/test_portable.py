"""A RoPE/ALiBi/sinusoidal/NoPE/T5-bias/TUPE folder loads without posswap: ``trust_remote_code=True`` gives the same logits and
the same greedy ``generate`` as ``posswap.from_pretrained``; plain transformers refuses it; no written file imports
posswap.

One common body over (method x architecture x head x backend). Every folder is loaded in ONE subprocess where
``import posswap`` raises (an import hook), so the bundle cannot lean on the installed library.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import make_model, run_without_posswap, sharpen_qk
from safetensors.torch import load_file

import posswap
from posswap import cli
from posswap.hub import push_to_hub

NEW_LENGTH = 96

# name -> (model_type, head, Auto class, config). Heads: base, causal LM, masked LM, sequence / token classification.
# The flex cases run SDPA on CPU (portable/posswap_flex_route.py): a folder carries that route too.
CASES = {
    "gpt2-rope": ("gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM", posswap.RopeConfig(max_length=NEW_LENGTH)),
    "gpt2-rope-yarn-partial": (
        "gpt2",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        posswap.RopeConfig(max_length=NEW_LENGTH, rope_type="yarn", rotary_dim=0.5),
    ),
    "gpt2-rope-dynamic-eager": (
        "gpt2",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        posswap.RopeConfig(max_length=NEW_LENGTH, rope_type="dynamic", backend="eager"),
    ),
    "gpt2-alibi": ("gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM", posswap.AlibiConfig(max_length=NEW_LENGTH)),
    "gpt2-rope-flex": (
        "gpt2",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        posswap.RopeConfig(max_length=NEW_LENGTH, backend="flex"),
    ),
    "gpt2-alibi-eager-keep": (
        "gpt2",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        posswap.AlibiConfig(max_length=NEW_LENGTH, backend="eager", absolute="keep"),
    ),
    # init="fit": non-zero bucket tables, so a table the bundle failed to restore would show in the logits.
    "gpt2-t5-bias-fit": (
        "gpt2",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        posswap.T5BiasConfig(max_length=NEW_LENGTH, init="fit"),
    ),
    "gpt2-rope-seqcls": (
        "gpt2",
        "GPT2ForSequenceClassification",
        "AutoModelForSequenceClassification",
        posswap.RopeConfig(max_length=NEW_LENGTH),
    ),
    "bert-rope-mlm": ("bert", "BertForMaskedLM", "AutoModelForMaskedLM", posswap.RopeConfig(max_length=NEW_LENGTH)),
    "bert-alibi-mlm": ("bert", "BertForMaskedLM", "AutoModelForMaskedLM", posswap.AlibiConfig(max_length=NEW_LENGTH)),
    "bert-alibi-seqcls-flex": (
        "bert",
        "BertForSequenceClassification",
        "AutoModelForSequenceClassification",
        posswap.AlibiConfig(max_length=NEW_LENGTH, backend="flex"),
    ),
    "bert-t5-bias-perlayer-mlm": (
        "bert",
        "BertForMaskedLM",
        "AutoModelForMaskedLM",
        posswap.T5BiasConfig(max_length=NEW_LENGTH, init="fit", per_layer=True),
    ),
    "bert-rope-base-keep": (
        "bert",
        "BertModel",
        "AutoModel",
        posswap.RopeConfig(max_length=NEW_LENGTH, absolute="keep"),
    ),
    # E5-Base-4k's placement: the folder must carry the code that multiplies short inputs' position ids.
    "bert-interpolate-exact-mlm": (
        "bert",
        "BertForMaskedLM",
        "AutoModelForMaskedLM",
        posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="stride", exact_short_inputs=True),
    ),
    "roberta-rope-mlm": (
        "roberta",
        "RobertaForMaskedLM",
        "AutoModelForMaskedLM",
        posswap.RopeConfig(max_length=NEW_LENGTH),
    ),
    "xlmr-alibi-tokcls": (
        "xlm-roberta",
        "XLMRobertaForTokenClassification",
        "AutoModelForTokenClassification",
        posswap.AlibiConfig(max_length=NEW_LENGTH),
    ),
    "electra-rope-tokcls": (
        "electra",
        "ElectraForTokenClassification",
        "AutoModelForTokenClassification",
        posswap.RopeConfig(max_length=NEW_LENGTH),
    ),
    "gpt2-sinusoidal": (
        "gpt2",
        "GPT2LMHeadModel",
        "AutoModelForCausalLM",
        posswap.SinusoidalConfig(max_length=NEW_LENGTH),
    ),
    "roberta-sinusoidal-mlm": (
        "roberta",
        "RobertaForMaskedLM",
        "AutoModelForMaskedLM",
        posswap.SinusoidalConfig(max_length=NEW_LENGTH, theta=500.0),
    ),
    "gpt2-nope": ("gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM", posswap.NopeConfig(max_length=NEW_LENGTH)),
    "bert-nope-mlm": ("bert", "BertForMaskedLM", "AutoModelForMaskedLM", posswap.NopeConfig(max_length=NEW_LENGTH)),
    "gpt2-tupe": ("gpt2", "GPT2LMHeadModel", "AutoModelForCausalLM", posswap.TupeConfig(max_length=NEW_LENGTH)),
    "roberta-tupe-r-mlm": (
        "roberta",
        "RobertaForMaskedLM",
        "AutoModelForMaskedLM",
        posswap.TupeConfig(max_length=NEW_LENGTH, cls_reset=True, relative=True),
    ),
}

# Runs with posswap unimportable: load each folder with trust_remote_code, write logits and generations.
LOADER = textwrap.dedent("""
    import json, sys
    import torch, transformers
    from safetensors.torch import save_file
    jobs = json.loads(open(sys.argv[1]).read())
    for job in jobs:
        auto = getattr(transformers, job["auto"])
        try:
            auto.from_pretrained(job["source"])
            job["plain"] = "loaded"
        except Exception as error:  # what a user without trust_remote_code sees
            job["plain"] = f"{type(error).__name__}: {error}"
        model = auto.from_pretrained(job["source"], trust_remote_code=True).eval()
        ids = torch.tensor(job["ids"])
        mask = torch.tensor(job["mask"])
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=mask)
        tensors = {"logits": out.logits if hasattr(out, "logits") else out.last_hidden_state}
        if job["auto"] == "AutoModelForCausalLM":
            tensors["generated"] = model.generate(input_ids=ids[:, :12], attention_mask=mask[:, :12], max_new_tokens=6,
                                                  do_sample=False, pad_token_id=0)
        save_file({k: v.contiguous() for k, v in tensors.items()}, job["out"])
        job["class"] = type(model).__name__
    open(sys.argv[1], "w").write(json.dumps(jobs))  # not stdout: transformers' prompt writes there
""")


def sharpened(model_type: str, head: str):
    return sharpen_qk(make_model(model_type, head))


def inputs(model_type: str):
    ids = torch.randint(3, 99, (2, 40), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    if model_type == "gpt2":
        mask[1, :7] = 0  # left padding, as generate sees it
    else:
        mask[1, -7:] = 0
    return ids, mask


def reference(model, auto: str, ids, mask) -> dict:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    result = {"logits": out.logits if hasattr(out, "logits") else out.last_hidden_state}
    if auto == "AutoModelForCausalLM":
        result["generated"] = model.generate(
            input_ids=ids[:, :12], attention_mask=mask[:, :12], max_new_tokens=6, do_sample=False, pad_token_id=0
        )
    return result


def load_without_posswap(jobs: list[dict], env: dict | None = None) -> list[dict]:
    exchange = Path(jobs[0]["out"]).with_suffix(".jobs.json")
    exchange.write_text(json.dumps(jobs))
    run_without_posswap(LOADER, str(exchange), env=env)
    return json.loads(exchange.read_text())


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every case patched and saved with model.save_pretrained; the posswap.from_pretrained reference of each."""
    root = tmp_path_factory.mktemp("portable")
    os.environ["HF_MODULES_CACHE"] = str(root / "modules")  # the subprocess caches the bundle here
    jobs, references = [], {}
    for name, (model_type, head, auto, config) in CASES.items():
        model = posswap.patch(sharpened(model_type, head), config).eval()
        model.save_pretrained(root / name)
        loaded = posswap.from_pretrained(str(root / name)).eval()
        ids, mask = inputs(model_type)
        references[name] = reference(loaded, auto, ids, mask)
        torch.testing.assert_close(references[name]["logits"], reference(model, auto, ids, mask)["logits"])
        jobs.append(
            {
                "name": name,
                "source": str(root / name),
                "auto": auto,
                "ids": ids.tolist(),
                "mask": mask.tolist(),
                "out": str(root / f"{name}.safetensors"),
            }
        )
    return root, {job["name"]: job for job in load_without_posswap(jobs)}, references


@pytest.mark.parametrize("name", CASES)
def test_remote_code_equals_posswap(saved, name):
    root, loaded, references = saved
    job = loaded[name]
    got = load_file(job["out"])
    torch.testing.assert_close(got["logits"], references[name]["logits"], atol=1e-5, rtol=1e-5)
    if "generated" in references[name]:
        assert torch.equal(got["generated"], references[name]["generated"])
    assert job["class"] == "Posswap" + CASES[name][1]


@pytest.mark.parametrize("name", CASES)
def test_plain_transformers_refuses_and_no_file_imports_posswap(saved, name):
    root, loaded, _ = saved
    assert "trust_remote_code" in loaded[name]["plain"], loaded[name]["plain"]
    config = json.loads((root / name / "config.json").read_text())
    assert config["model_type"] == "posswap-" + CASES[name][0]
    assert config["auto_map"][CASES[name][2]] == "modeling_posswap.Posswap" + CASES[name][1]
    code = list((root / name).glob("*.py"))
    assert {p.name for p in code} >= {"modeling_posswap.py", "posswap_runtime.py", "posswap_functional.py"}
    for path in code:
        assert not re.search(r"^\s*(import|from)\s+posswap\b", path.read_text(), re.M), path.name


def test_positions_matter_in_these_models(saved):
    """The comparisons above are only worth something if the rotation changes the outputs."""
    from posswap.portable.posswap_hooks import remove_hooks
    from posswap.portable.posswap_rotary import PrepareRotation, RotateProjection

    root, _, references = saved
    model = posswap.from_pretrained(str(root / "gpt2-rope")).eval()
    for block in model.transformer.h:
        remove_hooks(block.attn, PrepareRotation)
        remove_hooks(block.attn.c_attn, RotateProjection)
    ids, mask = inputs("gpt2")
    unrotated = reference(model, "AutoModelForCausalLM", ids, mask)["logits"]
    assert (unrotated - references["gpt2-rope"]["logits"]).abs().max() > 1e-2  # logits of this tiny model are ~0.1


def test_push_and_cli_folders_load_without_posswap(hub, tmp_path, monkeypatch):
    """posswap.push_to_hub and `posswap patch --out` write the bundle too; the pushed repo loads from the Hub."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    model = posswap.patch(sharpened("gpt2", "GPT2LMHeadModel"), posswap.AlibiConfig(max_length=NEW_LENGTH)).eval()
    push_to_hub(model, "me/gpt2-alibi")
    base = sharpened("bert", "BertForMaskedLM")
    base.save_pretrained(tmp_path / "bert")
    assert (
        cli.main(
            ["patch", str(tmp_path / "bert"), "--method", "rope", "--max-length", "64", "--out", str(tmp_path / "cli")]
        )
        == 0
    )
    jobs = []
    for name, source, auto, model_type in (
        ("hub", "me/gpt2-alibi", "AutoModelForCausalLM", "gpt2"),
        ("cli", str(tmp_path / "cli"), "AutoModelForMaskedLM", "bert"),
    ):
        ids, mask = inputs(model_type)
        jobs.append(
            {
                "name": name,
                "source": source,
                "auto": auto,
                "ids": ids.tolist(),
                "mask": mask.tolist(),
                "out": str(tmp_path / f"{name}.safetensors"),
            }
        )
    env = {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_home")}
    results = {job["name"]: job for job in load_without_posswap(jobs, env)}
    ids, mask = inputs("gpt2")
    expected = reference(model, "AutoModelForCausalLM", ids, mask)
    got = load_file(results["hub"]["out"])
    torch.testing.assert_close(got["logits"], expected["logits"], atol=1e-5, rtol=1e-5)
    assert torch.equal(got["generated"], expected["generated"])
    cli_model = posswap.from_pretrained(str(tmp_path / "cli")).eval()
    ids, mask = inputs("bert")
    torch.testing.assert_close(
        load_file(results["cli"]["out"])["logits"],
        reference(cli_model, "AutoModelForMaskedLM", ids, mask)["logits"],
        atol=1e-5,
        rtol=1e-5,
    )


def test_interpolate_folder_stays_plain_transformers(tmp_path):
    model = posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), posswap.InterpolateConfig(max_length=NEW_LENGTH))
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "gpt2"
    assert not list(tmp_path.glob("*.py"))


@pytest.mark.parametrize("method", ["rope", "alibi"])
def test_folders_saved_before_the_bundle_still_load(tmp_path, method):
    """Folders written by posswap 0.1 say model_type gpt2 and carry no code: posswap.from_pretrained loads them."""
    config = posswap.config_from_dict({"method": method, "max_length": NEW_LENGTH})
    model = posswap.patch(sharpened("gpt2", "GPT2LMHeadModel"), config).eval()
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.update(model_type="gpt2", architectures=["GPT2LMHeadModel"])
    del data["auto_map"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    for path in tmp_path.glob("*.py"):
        path.unlink()
    ids, mask = inputs("gpt2")
    loaded = posswap.from_pretrained(str(tmp_path)).eval()
    torch.testing.assert_close(
        reference(loaded, "AutoModelForCausalLM", ids, mask)["logits"],
        reference(model, "AutoModelForCausalLM", ids, mask)["logits"],
    )


def test_with_posswap_imported_auto_classes_load_it_without_remote_code(tmp_path):
    import transformers

    model = posswap.patch(sharpened("bert", "BertForMaskedLM"), posswap.AlibiConfig(max_length=NEW_LENGTH)).eval()
    model.save_pretrained(tmp_path)
    loaded = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    ids, mask = inputs("bert")
    torch.testing.assert_close(
        reference(loaded, "AutoModelForMaskedLM", ids, mask)["logits"],
        reference(model, "AutoModelForMaskedLM", ids, mask)["logits"],
    )
