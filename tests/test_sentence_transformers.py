"""sentence-transformers models are first-class: ``posswap.patch(SentenceTransformer, config)`` patches the
transformer and raises ``max_seq_length``; the saved folder is a sentence-transformers folder that loads three
ways with the same embeddings: ``posswap.from_pretrained``, ``SentenceTransformer(folder)`` where posswap is
imported, and ``SentenceTransformer(folder, trust_remote_code=True)`` where posswap cannot be imported (plain
loading there works for ``interpolate`` and is refused for the others). ``posswap patch`` and ``push`` write
and upload whole sentence-transformers folders.

The real all-MiniLM-L6-v2 at 2048 for the main methods, tiny BERT and RoBERTa sentence-transformers built here
for every method and for the Hub (whose stand-in takes only small uploads). All folders are loaded in ONE
subprocess without posswap, as in test_portable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import huggingface_hub
import pytest
import torch
import transformers
from conftest import assert_untouched, run_without_posswap, sharpen_qk, snapshot
from safetensors.torch import load_file
from test_common import FACTORIES

import posswap
from posswap import cli
from posswap.data import read_document
from posswap.hub import model_card, push_to_hub
from posswap.portable.posswap_runtime import needs_runtime_code

st = pytest.importorskip("sentence_transformers")
try:  # sentence-transformers 6
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
except ImportError:  # 5
    from sentence_transformers.models import Pooling, Transformer

# NoPE on an encoder warns that it is the no-positions ablation; it is patched here only to round-trip.
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:posswap. NoPE"),
]

LENGTH = 2048  # MiniLM: 512 -> 2048
MINILM = {
    "copy": posswap.InterpolateConfig(max_length=LENGTH, mode="copy"),
    "linear": posswap.InterpolateConfig(max_length=LENGTH, mode="linear"),
    "stride-exact": posswap.InterpolateConfig(max_length=LENGTH, mode="stride", exact_short_inputs=True),
    "rope": posswap.RopeConfig(max_length=LENGTH),
    "alibi": posswap.AlibiConfig(max_length=LENGTH),
}
TINY_OLD, TINY_NEW = 32, 128  # tiny models: 32 -> 128 positions
TINY = (
    {f"tiny-bert-{m}": ("bert", factory(TINY_NEW)) for m, factory in FACTORIES.items()}
    | {f"tiny-roberta-{m}": ("roberta", FACTORIES[m](TINY_NEW)) for m in ("interpolate", "rope", "alibi")}
    | {
        "tiny-roberta-stride-exact": (
            "roberta",
            posswap.InterpolateConfig(max_length=TINY_NEW, mode="stride", exact_short_inputs=True),
        )
    }
)

# Runs where posswap cannot be imported: each folder loaded plainly, then with trust_remote_code.
LOADER = textwrap.dedent("""
    import json, sys
    import torch
    from safetensors.torch import save_file
    from sentence_transformers import SentenceTransformer
    jobs = json.loads(open(sys.argv[1]).read())
    for job in jobs:
        tensors = {}
        try:
            plain = SentenceTransformer(job["folder"], device="cpu")
            tensors["plain"] = plain.encode(job["texts"], convert_to_tensor=True)
            job["plain"] = "loaded"
        except Exception as error:  # what a user without trust_remote_code sees
            job["plain"] = f"{type(error).__name__}: {error}"
        model = SentenceTransformer(job["folder"], device="cpu", trust_remote_code=True)
        tensors["remote"] = model.encode(job["texts"], convert_to_tensor=True)
        job["class"] = type(model[0].auto_model).__name__
        job["max_seq_length"] = model.max_seq_length
        save_file({k: v.contiguous() for k, v in tensors.items()}, job["out"])
    open(sys.argv[1], "w").write(json.dumps(jobs))
""")


def load_without_posswap(jobs: list[dict]) -> dict[str, dict]:
    exchange = Path(jobs[0]["out"]).with_suffix(".jobs.json")
    exchange.write_text(json.dumps(jobs))
    run_without_posswap(LOADER, str(exchange), modules=exchange.parent / "modules")
    return {job["name"]: job for job in json.loads(exchange.read_text())}


def document(tokenizer, tokens: int) -> str:
    """About ``tokens`` word pieces of Persuasion."""
    ids = tokenizer(read_document("persuasion")[:40000], add_special_tokens=False, verbose=False).input_ids
    return tokenizer.decode(ids[:tokens])


def token_count(model, text: str) -> int:
    """Tokens the model reads of ``text`` (after its own truncation)."""
    return int(model.preprocess([text])["attention_mask"].sum())


def embed(model, texts: list[str]) -> torch.Tensor:
    return model.encode(texts, convert_to_tensor=True, batch_size=len(texts))


def tiny_sentence_transformer(folder: Path, minilm_path: str, model_type: str = "bert", positions: int = TINY_OLD):
    """A SentenceTransformer (transformer + mean pooling) around a tiny random BERT or RoBERTa with MiniLM's
    tokenizer; RoBERTa's padding id is 1, so its table has 2 rows before the first position, as RoBERTa's has."""
    torch.manual_seed(0)
    shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    if model_type == "bert":
        tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_path, model_max_length=positions)
        model = transformers.BertModel(
            transformers.BertConfig(vocab_size=len(tokenizer), **shape, max_position_embeddings=positions)
        )
    else:
        tokenizer = transformers.AutoTokenizer.from_pretrained(
            minilm_path, model_max_length=positions, pad_token="[unused0]"
        )
        assert tokenizer.pad_token_id == 1
        config = transformers.RobertaConfig(
            vocab_size=len(tokenizer), **shape, pad_token_id=1, max_position_embeddings=positions + 2
        )
        model = transformers.RobertaModel(config)
    sharpen_qk(model).save_pretrained(folder)  # q.k large enough that positions show in the embeddings
    tokenizer.save_pretrained(folder)
    transformer = Transformer(str(folder))
    return st.SentenceTransformer(modules=[transformer, Pooling(32, "mean")], device="cpu")


@pytest.fixture(scope="module")
def saved(tmp_path_factory, minilm_path):
    """Every case patched (checked on the way) and saved with the model's own ``save``; then loaded without posswap."""
    root = tmp_path_factory.mktemp("st")
    cases, jobs = {}, []
    for name, config in MINILM.items():
        model = st.SentenceTransformer(minilm_path, device="cpu")
        assert model.max_seq_length == 256  # all-MiniLM-L6-v2's setting
        texts = [document(model.tokenizer, 600), "A short sentence about Anne Elliot."]
        cases[name] = patch_and_save(model, config, texts, root / name)
        assert cases[name]["tokens"][0] > 590  # read whole, past 512
    for name, (model_type, config) in TINY.items():
        model = tiny_sentence_transformer(root / f"{name}-base", minilm_path, model_type)
        assert model.max_seq_length == TINY_OLD
        texts = [document(model.tokenizer, 100), "A short sentence."]
        cases[name] = patch_and_save(model, config, texts, root / name)
        assert cases[name]["tokens"][0] > TINY_OLD + 60
    for name, case in cases.items():
        jobs.append(
            {
                "name": name,
                "folder": str(case["folder"]),
                "texts": case["texts"],
                "out": str(root / f"{name}.safetensors"),
            }
        )
    return cases, load_without_posswap(jobs)


def patch_and_save(model, config, texts: list[str], folder: Path) -> dict:
    assert posswap.patch(model, config) is model
    transformer = model[0].auto_model
    rows = config.max_length + (2 if transformer.config.model_type == "roberta" else 0)
    assert (model.max_seq_length, model.tokenizer.model_max_length) == (config.max_length, config.max_length)
    assert transformer.config.max_position_embeddings == rows and transformer.config.posswap["method"] == config.method
    embeddings = embed(model, texts)
    assert torch.isfinite(embeddings).all()
    # Both of sentence-transformers' methods: save_pretrained is save under another name.
    save = model.save_pretrained if folder.name.startswith("tiny") else model.save
    save(str(folder))
    return {
        "folder": folder,
        "texts": texts,
        "embeddings": embeddings,
        "config": config,
        "model": model,
        "tokens": [token_count(model, text) for text in texts],
    }


CASES = [*MINILM, *TINY]


def needs_code(case: dict) -> bool:
    return needs_runtime_code(case["config"].to_dict())


@pytest.mark.parametrize("name", CASES)
def test_posswap_from_pretrained_gives_the_same_embeddings(saved, name):
    case = saved[0][name]
    loaded = posswap.from_pretrained(str(case["folder"]))
    assert type(loaded) is st.SentenceTransformer
    assert loaded.max_seq_length == case["config"].max_length
    assert loaded[0].auto_model.config.posswap == case["model"][0].auto_model.config.posswap
    torch.testing.assert_close(embed(loaded, case["texts"]), case["embeddings"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_sentence_transformers_with_posswap_imported_loads_it(saved, name):
    """Where posswap is imported, its Auto classes are registered: no trust_remote_code needed."""
    case = saved[0][name]
    loaded = st.SentenceTransformer(str(case["folder"]), device="cpu")
    assert loaded.max_seq_length == case["config"].max_length
    torch.testing.assert_close(embed(loaded, case["texts"]), case["embeddings"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", CASES)
def test_without_posswap_trust_remote_code_gives_the_same_embeddings(saved, name):
    case, job = saved[0][name], saved[1][name]
    got = load_file(job["out"])
    torch.testing.assert_close(got["remote"], case["embeddings"], atol=1e-5, rtol=0)
    assert job["max_seq_length"] == case["config"].max_length
    if needs_code(case):
        assert job["class"].startswith("Posswap")
        # Plain loading is refused, never a model without its positions.
        assert job["plain"] != "loaded" and "trust_remote_code" in job["plain"], job["plain"]
        assert "plain" not in got
    else:  # interpolate: a stock model of a new size
        assert job["plain"] == "loaded" and not job["class"].startswith("Posswap")
        torch.testing.assert_close(got["plain"], case["embeddings"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["copy", "rope", "tiny-roberta-rope"])
def test_the_folder_is_a_sentence_transformers_folder(saved, name):
    case = saved[0][name]
    folder = case["folder"]
    modules = json.loads((folder / "modules.json").read_text())
    assert [m["path"] for m in modules][:2] == ["", "1_Pooling"] and (folder / "1_Pooling" / "config.json").is_file()
    config = json.loads((folder / "config.json").read_text())
    assert config["posswap"]["max_length"] == case["config"].max_length
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == case["config"].max_length
    if needs_code(case):
        assert config["model_type"].startswith("posswap-") and config["auto_map"]["AutoModel"].startswith(
            "modeling_posswap."
        )
        assert (folder / "modeling_posswap.py").is_file()
        assert not [p for p in folder.glob("*.py") if re.search(r"^\s*(import|from)\s+posswap\b", p.read_text(), re.M)]
    else:
        assert config["model_type"] == "bert" and not list(folder.glob("*.py"))
    # The card saved is a new one (the source folder's describes the model before the patch), tagged.
    card = (folder / "README.md").read_text()
    assert f"**Maximum Sequence Length:** {case['config'].max_length} tokens" in card and "- posswap" in card


@pytest.mark.parametrize("name", ["tiny-roberta-rope", "tiny-roberta-interpolate"])
def test_roberta_offset_usable_length_is_max_length(saved, name):
    """RoBERTa's table holds 2 more rows; the tokenizer limit is the usable length, and a longer text is cut there."""
    case = saved[0][name]
    loaded = posswap.from_pretrained(str(case["folder"]))
    assert loaded[0].auto_model.config.max_position_embeddings == TINY_NEW + 2
    assert loaded.max_seq_length == TINY_NEW and loaded.tokenizer.model_max_length == TINY_NEW
    long = document(loaded.tokenizer, 3 * TINY_NEW)
    assert token_count(loaded, long) == TINY_NEW
    assert torch.isfinite(embed(loaded, [long, "short"])).all()


def test_interpolate_copy_within_512_tokens_equals_the_stock_model(saved, minilm_path):
    stock = st.SentenceTransformer(minilm_path, device="cpu")
    patched = saved[0]["copy"]["model"]
    texts = [document(stock.tokenizer, n) for n in (20, 250, 510)]
    assert torch.equal(embed(patched, texts[:2]), embed(stock, texts[:2]))  # within the stock's own 256
    stock.max_seq_length = 512
    counts = [token_count(stock, t) for t in texts]
    assert counts[1] <= 256 < counts[2] <= 512
    assert torch.equal(embed(patched, texts), embed(stock, texts))
    # Past 512 the patched model reads on: the 600-token document is not its first 512 tokens.
    case = saved[0]["copy"]
    assert not torch.allclose(case["embeddings"][0], embed(stock, case["texts"][:1])[0], atol=1e-3)


def test_a_bad_config_leaves_the_sentence_transformer_untouched(minilm_path):
    model = st.SentenceTransformer(minilm_path, device="cpu")
    bad = [
        posswap.RopeConfig(max_length=LENGTH, rotary_dim=64),  # MiniLM's heads have 32 dims
        posswap.InterpolateConfig(max_length=10**10),  # more memory than there is
        {"method": "rope", "max_length": LENGTH, "theta": 0.5},
        {"method": "no-such-method", "max_length": LENGTH},
        "rope",
    ]
    text = ["Anne Elliot walked to Uppercross. " * 5]
    before, card, expected = snapshot(model[0].auto_model), model._model_card_text, embed(model, text)
    for config in bad:
        with pytest.raises((ValueError, TypeError)):
            posswap.patch(model, config)
        assert_untouched(model[0].auto_model, before)
        assert (model.max_seq_length, model.tokenizer.model_max_length, model._model_card_text) == (256, 256, card)
    # Already patched with one method: another is refused and nothing changes.
    posswap.patch(model, posswap.AlibiConfig(max_length=1024))
    after = snapshot(model[0].auto_model)
    with pytest.raises(ValueError, match="already patched"):
        posswap.patch(model, posswap.RopeConfig(max_length=LENGTH))
    assert_untouched(model[0].auto_model, after)
    assert model.max_seq_length == 1024
    # A sentence-transformers module without a transformer (the pooling) is named.
    with pytest.raises(ValueError, match="no sentence-transformers Transformer module"):
        posswap.patch(model[1], posswap.RopeConfig(max_length=LENGTH))
    assert torch.isfinite(embed(model, text)).all() and not torch.equal(embed(model, text), expected)


def test_cli_patch_writes_a_sentence_transformers_folder(minilm_path, tmp_path, capsys):
    out = tmp_path / "minilm-alibi-1k"
    assert cli.main(["patch", minilm_path, "--method", "alibi", "--max-length", "1024", "--out", str(out)]) == 0
    assert "max_length 512 -> 1024, max_seq_length 1024" in capsys.readouterr().out
    assert {
        "modules.json",
        "1_Pooling",
        "2_Normalize",
        "config.json",
        "modeling_posswap.py",
        "model.safetensors",
        "tokenizer.json",
        "config_sentence_transformers.json",
    } <= {p.name for p in out.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # written whole: no staging folder left

    expected = posswap.patch(st.SentenceTransformer(minilm_path, device="cpu"), posswap.AlibiConfig(max_length=1024))
    loaded = st.SentenceTransformer(str(out), device="cpu")
    texts = [document(loaded.tokenizer, 900), "short"]
    assert 512 < token_count(loaded, texts[0]) <= 1024
    torch.testing.assert_close(embed(loaded, texts), embed(expected, texts), atol=1e-5, rtol=0)

    # An existing folder is refused as for any model folder, before anything is loaded.
    assert cli.main(["patch", minilm_path, "--method", "rope", "--max-length", "1024", "--out", str(out)]) == 2
    assert json.loads((out / "config.json").read_text())["posswap"]["method"] == "alibi"


def test_from_pretrained_names_the_extra_when_sentence_transformers_is_missing(saved, monkeypatch):
    folder = str(saved[0]["tiny-bert-rope"]["folder"])
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import sentence_transformers raises
    with pytest.raises(ImportError, match=r"pip install 'posswap\[st\]'"):
        posswap.from_pretrained(folder)
    # The transformer alone still loads, when asked for.
    assert type(posswap.from_pretrained(folder, model_class=transformers.AutoModel)).__name__ == "PosswapBertModel"


def test_import_posswap_does_not_import_sentence_transformers(tmp_path):
    script = textwrap.dedent(f"""
        import sys, transformers, posswap
        model = transformers.BertModel(transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                               intermediate_size=37, max_position_embeddings=32))
        posswap.patch(model, posswap.RopeConfig(max_length=64)).save_pretrained({str(tmp_path)!r})
        posswap.from_pretrained({str(tmp_path)!r})
        assert "sentence_transformers" not in sys.modules, "imported"
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_push_uploads_the_whole_sentence_transformers_folder(hub, tmp_path, minilm_path):
    model = posswap.patch(
        tiny_sentence_transformer(tmp_path / "base", minilm_path), posswap.RopeConfig(max_length=TINY_NEW)
    )
    texts = [document(model.tokenizer, 100), "short"]
    expected = embed(model, texts)

    # posswap.push_to_hub(model): a sentence-transformers folder with posswap's card.
    push_to_hub(model, "me/st-rope")
    files = hub.files("me/st-rope")
    assert {
        "modules.json",
        "1_Pooling/config.json",
        "config.json",
        "modeling_posswap.py",
        "model.safetensors",
        "tokenizer.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "README.md",
    } <= set(files)
    assert json.loads(files["config.json"])["posswap"]["method"] == "rope"
    card = files["README.md"].decode()
    meta = huggingface_hub.ModelCard(card).data
    assert meta.library_name == "sentence-transformers" and meta.tags == ["posswap", "rope", "sentence-transformers"]
    assert 'SentenceTransformer("me/st-rope", trust_remote_code=True)' in card
    assert 'posswap.from_pretrained("me/st-rope")' in card
    loaded = posswap.from_pretrained(str(hub.root / "me/st-rope"))
    torch.testing.assert_close(embed(loaded, texts), expected, atol=1e-5, rtol=0)

    # `posswap push FOLDER` of a saved one: every file of the folder arrives as it is (its card kept).
    model.save(str(tmp_path / "saved"))
    assert cli.main(["push", str(tmp_path / "saved"), "me/st-rope-folder"]) == 0
    local = {
        str(p.relative_to(tmp_path / "saved")): p.read_bytes() for p in (tmp_path / "saved").rglob("*") if p.is_file()
    }
    assert hub.files("me/st-rope-folder") == local
    card = model_card(tmp_path / "saved", repo_id="me/st")  # what a push writes where the folder has no card
    assert huggingface_hub.ModelCard(card).data.library_name == "sentence-transformers"
    assert 'SentenceTransformer("me/st", trust_remote_code=True)' in card and "AutoModel" not in card

    # sentence-transformers' own push_to_hub also carries posswap's block and code.
    model.push_to_hub("me/st-rope-own")
    files = hub.files("me/st-rope-own")
    assert {"modules.json", "1_Pooling/config.json", "modeling_posswap.py"} <= set(files)
    assert json.loads(files["config.json"])["posswap"]["method"] == "rope"
    loaded = st.SentenceTransformer(str(hub.root / "me/st-rope-own"), device="cpu")
    torch.testing.assert_close(embed(loaded, texts), expected, atol=1e-5, rtol=0)
