"""``posswap export --format onnx``: the shipped embedding recipe's patch (interpolate, stride, exact_short_inputs)
on the real MiniLM, exported and run with onnxruntime alone, gives the torch model's embeddings at 60, 400 and 1,400
words and the stock model's for a text within 512 tokens (the rule is in the graph); the int8 graph stays close; a
plain transformers folder exports too; what has no graph form (RoPE's dynamic scaling) is refused with nothing
written. The methods that change attention: tests/test_onnx_methods.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

import posswap
from posswap.cli import main
from posswap.data import read_document
from posswap.training.recipe import load_recipe

pytest.importorskip("onnxruntime", reason="the onnx extra: pip install 'posswap[onnx]'")
pytest.importorskip("onnxscript", reason="the onnx extra: pip install 'posswap[onnx]'")
st_module = pytest.importorskip("sentence_transformers")

from posswap.onnx.encoder import OnnxEncoder  # noqa: E402
from posswap.onnx.export import export_onnx  # noqa: E402

WORDS = read_document("persuasion").split()
TEXTS = {n: " ".join(WORDS[1000 : 1000 + n]) for n in (60, 400, 700, 1400)}  # 700: past 512 tokens, within 2048


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


@pytest.fixture(scope="module")
def exported(tmp_path_factory, minilm_path):
    """The stock MiniLM patched as recipes/minilm-embed-2k.yaml says, saved, exported with the int8 graph."""
    root = tmp_path_factory.mktemp("onnx")
    stock = st_module.SentenceTransformer(minilm_path, device="cpu")
    patched = posswap.patch(
        st_module.SentenceTransformer(minilm_path, device="cpu"), load_recipe("minilm-embed-2k")[0].posswap
    )
    patched.save(str(root / "patched"))
    result = export_onnx(root / "patched", root / "out", int8=True)
    texts = list(TEXTS.values())
    return {
        "result": result,
        "patched": root / "patched",
        "out": root / "out",
        "torch": patched.encode(texts, batch_size=1),
        "stock": stock.encode(texts[:1]),
        "lengths": [len(patched.tokenizer(t).input_ids) for t in texts],
    }


def test_the_graph_gives_the_torch_model_embeddings(exported):
    assert exported["lengths"][0] <= 512 < exported["lengths"][2] < exported["lengths"][3] <= 2048  # both sides
    encoder = OnnxEncoder(exported["out"], threads=1)
    got = encoder.encode(list(TEXTS.values()), batch_size=1)
    assert cosines(got, exported["torch"]).min() >= 0.9999
    # One padded batch: each row placed by its own length (one within 512 tokens, one past it), as in torch.
    batched = encoder.encode(list(TEXTS.values())[1:3], batch_size=2)
    assert cosines(batched, exported["torch"][1:3]).min() >= 0.9999


def test_a_short_text_gets_the_stock_embedding(exported):
    got = OnnxEncoder(exported["out"], threads=1).encode(TEXTS[60])
    assert cosines(got, exported["stock"][0]) >= 0.9999


def test_the_folder_is_in_sentence_transformers_layout_without_torch_weights(exported):
    out = exported["out"]
    assert exported["result"].layout == "sentence-transformers" and exported["result"].max_difference <= 1e-4
    assert (out / "onnx" / "model.onnx").is_file() and (out / "modules.json").is_file()
    assert not list(out.glob("*.safetensors")) and not list(out.glob("*posswap*.py"))
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and "posswap" not in config and config["posswap_onnx"]["patched"]
    with pytest.raises(OSError):  # a torch load would run the table without the rule: it must fail, not guess
        st_module.SentenceTransformer(str(out), device="cpu")


def test_sentence_transformers_onnx_backend_loads_it(exported):
    pytest.importorskip(
        "optimum.onnxruntime", reason="optimum-onnx does not install beside transformers 5 (docs/onnx.md)"
    )
    try:
        model = st_module.SentenceTransformer(str(exported["out"]), backend="onnx", device="cpu")
    except ImportError as error:  # optimum-onnx 0.1 imports names transformers 5 removed
        pytest.skip(f"optimum-onnx cannot run with transformers {transformers.__version__}: {error}")
    assert cosines(model.encode(list(TEXTS.values())), exported["torch"]).min() >= 0.9999


def test_the_int8_graph_stays_close(exported):
    result = exported["result"]
    assert "onnx/model_qint8.onnx" in result.graphs and min(result.int8_cosine.values()) >= 0.95
    int8 = OnnxEncoder(exported["out"], file_name="onnx/model_qint8.onnx", threads=1).encode(
        list(TEXTS.values()), batch_size=1
    )
    assert cosines(int8, exported["torch"]).min() >= 0.98
    size = lambda name: (exported["out"] / "onnx" / name).stat().st_size  # noqa: E731
    assert size("model_qint8.onnx") < 0.7 * size("model.onnx")  # the token table (half the weights) stays float


def test_a_sentence_transformer_on_the_graph_gives_the_torch_late_chunks(exported):
    """What the int8 retrieval figures are measured with: the model's tokenizer and pooling around the graph."""
    from posswap.onnx.backed import with_onnx_graph

    torch_model = posswap.from_pretrained(str(exported["patched"]), device="cpu")
    on_graph = with_onnx_graph(
        posswap.from_pretrained(str(exported["patched"]), device="cpu"), exported["out"] / "onnx/model.onnx"
    )
    text = [TEXTS[1400]]
    assert cosines(on_graph.encode(text), exported["torch"][3:]).min() >= 0.9999
    expected = posswap.late_chunks(torch_model, text, chunk_tokens=128)[0]
    got = posswap.late_chunks(on_graph, text, chunk_tokens=128)[0]
    assert len(got) == len(expected) > 8 and cosines(got, expected).min() >= 0.9999
    int8 = with_onnx_graph(torch_model, exported["out"] / "onnx/model_qint8.onnx")
    assert 0.95 <= cosines(posswap.late_chunks(int8, text, chunk_tokens=128)[0], expected).min() < 0.9999


def test_a_missing_graph_is_refused(exported, tmp_path):
    from posswap.onnx.backed import with_onnx_graph

    with pytest.raises(ValueError, match="graph: no file"):
        with_onnx_graph(posswap.from_pretrained(str(exported["patched"]), device="cpu"), tmp_path / "none.onnx")


@pytest.mark.parametrize("per_length,blocks", [("false", 1), ("true", 1), ("true", 2)])
def test_a_transformers_folder_exports_in_optimums_layout(bases, tmp_path, per_length, blocks):
    source = tmp_path / "patched"
    assert main(["patch", str(bases / "bert"), "--method", "interpolate", "--max-length", "128", "--mode", "stride",
                 "--exact-short-inputs", "true", "--stride-per-length", per_length, "--stride-blocks", str(blocks),
                 "--out", str(source)]) == 0  # fmt: skip
    assert main(["export", str(source), "--format", "onnx", "--out", str(tmp_path / "out")]) == 0
    import onnxruntime

    model = posswap.from_pretrained(str(source)).eval()
    assert model.config.posswap["stride_per_length"] == (per_length == "true")
    assert (model.config.posswap.get("stride_blocks") or 1) == blocks
    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    for length in (20, 50, 100):  # within the old 32 positions, past them, and (2 blocks) in the second block
        ids = torch.randint(1000, 5000, (1, length), generator=torch.Generator().manual_seed(length))
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        with torch.no_grad():
            expected = model(**feed).logits
        got = session.run(None, {i.name: feed[i.name].numpy() for i in session.get_inputs()})[0]
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "options,message",
    [(["--method", "rope", "--max-length", "64", "--rope-type", "dynamic"], "method 'rope': RoPE's dynamic scaling")],
)
def test_what_has_no_graph_form_is_refused(bases, tmp_path, capsys, options, message):
    source = tmp_path / "patched"
    assert main(["patch", str(bases / "bert"), *options, "--out", str(source)]) == 0
    capsys.readouterr()
    assert main(["export", str(source), "--format", "onnx", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading bar
    assert message in err and err.startswith("posswap export: error:")
    assert not (tmp_path / "out").exists()


def test_int8_without_onnx_is_refused(bases, tmp_path, capsys):
    assert main(["export", str(bases / "bert"), "--int8", "--out", str(tmp_path / "out")]) == 2
    assert "--int8 quantises an ONNX graph: add --format onnx" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_resized_gpt2_exports_with_the_torch_models_logits(bases, tmp_path):
    """A decoder whose patch only changed weights (interpolate copy): the graph is the plain GPT-2's."""
    source = tmp_path / "patched"
    assert (
        main(["patch", str(bases / "gpt2"), "--method", "interpolate", "--max-length", "64", "--out", str(source)]) == 0
    )
    assert main(["export", str(source), "--format", "onnx", "--out", str(tmp_path / "out")]) == 0
    import onnxruntime

    model = posswap.from_pretrained(str(source)).eval()
    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    for length in (20, 50):  # within the old 32 positions, and past them
        ids = torch.randint(100, 5000, (2, length), generator=torch.Generator().manual_seed(length))
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        with torch.no_grad():
            expected = model(**feed).logits
        got = session.run(None, {name: tensor.numpy() for name, tensor in feed.items()})[0]
        torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)
