"""Inputs a model cannot read are refused on every route (issue 60, case 2 and rough case 10).

A stride-placed model (``interpolate``, ``exact_short_inputs``) read an input longer than its table with no word:
the placement clamped every position id to the table's last row, so the length guard (which checks the ids it was
handed) never saw one past the table, and the exported graph clamped the same way. Each route is held here to what
the same model patched with ``mode="copy"`` (which has no placement) does. And ``OnnxEncoder`` names what is wrong
with its folder or its texts instead of passing onnxruntime's or tokenizers' errors through.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import OLD_LENGTH, make_model, sharpen_qk, token_ids

import posswap

NEW_LENGTH = 4 * OLD_LENGTH  # 128 rows
TOO_LONG = NEW_LENGTH + 22  # 150 tokens
VARIANTS = {
    "stride": {},
    "per-length": {"stride_per_length": True},
    "blocks": {"stride_per_length": True, "stride_blocks": 2},
    "blocks-plain": {"stride_blocks": 2},
}


def stride(**options) -> posswap.InterpolateConfig:
    return posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="stride", exact_short_inputs=True, **options)


def refusal(model, **inputs) -> str:
    with torch.no_grad(), pytest.raises(ValueError) as refused:
        model(**inputs)
    return str(refused.value)


@pytest.mark.parametrize("model_type,head", [("bert", "BertModel"), ("roberta", "RobertaForMaskedLM")])
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_stride_model_refuses_a_long_input_as_a_copy_model_does(model_type, head, variant):
    stock = sharpen_qk(make_model(model_type, head))
    copied = posswap.patch(copy.deepcopy(stock), posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="copy"))
    placed = posswap.patch(copy.deepcopy(stock), stride(**VARIANTS[variant]))
    ids = token_ids(TOO_LONG)
    expected = refusal(copied, input_ids=ids)  # the reference: the guard on a model with no placement
    assert f"needs {TOO_LONG} positions but this {model_type} model reads at most {NEW_LENGTH} tokens" in expected
    assert refusal(placed, input_ids=ids) == expected
    # A padded batch: a long row beside a short one, and rows all short but padded past the table.
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    assert refusal(placed, input_ids=ids, attention_mask=mask) == expected
    mask[0, 10:] = 0
    assert refusal(placed, input_ids=ids, attention_mask=mask) == expected
    with torch.no_grad():  # the whole table still reads, a short row padded beside a full one too
        full = token_ids(NEW_LENGTH)
        mask = torch.ones_like(full)
        mask[1, 5:] = 0
        assert torch.isfinite(placed(input_ids=full, attention_mask=mask)[0]).all()


def tiny_sentence_model(tmp_path, minilm_path, variant: str = "stride"):
    from test_sentence_transformers import tiny_sentence_transformer

    return posswap.patch(tiny_sentence_transformer(tmp_path / "base", minilm_path), stride(**VARIANTS[variant]))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("variant", ["stride", "blocks"])
def test_a_sentence_model_raised_past_its_table_refuses(tmp_path, minilm_path, variant):
    pytest.importorskip("sentence_transformers")
    model = tiny_sentence_model(tmp_path, minilm_path, variant)
    short = model.encode(["a short sentence"], convert_to_tensor=True)
    model.max_seq_length = 1000  # raised in memory past the 128 rows
    with pytest.raises(ValueError, match=f"needs 302 positions but this bert model reads at most {NEW_LENGTH} tokens"):
        model.encode([" ".join(["word"] * 300)])
    torch.testing.assert_close(model.encode(["a short sentence"], convert_to_tensor=True), short, atol=0, rtol=0)


@pytest.fixture(scope="module")
def exports(tmp_path_factory, minilm_path):
    """``exports(variant)``: a tiny stride sentence-transformers model (32 -> 128 positions) saved (torch) and
    exported (ONNX), once a variant."""
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("onnxruntime", reason="the onnx extra: pip install 'posswap[onnx]'")
    pytest.importorskip("onnxscript", reason="the onnx extra: pip install 'posswap[onnx]'")
    from posswap.onnx.export import export_onnx

    done = {}

    def export(variant: str) -> dict:
        if variant not in done:
            root = tmp_path_factory.mktemp(f"reliability-onnx-{variant}")
            model = tiny_sentence_model(root, minilm_path, variant)
            model.save(str(root / "torch"))
            export_onnx(root / "torch", root / "onnx")
            done[variant] = {"torch": root / "torch", "onnx": root / "onnx", "model": model}
        return done[variant]

    return export


@pytest.fixture
def exported(exports):
    return exports("stride")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("variant", ["stride", "per-length", "blocks"])
def test_the_exported_graph_does_not_clamp_a_long_input(exports, variant):
    import onnxruntime

    exported = exports(variant)
    session = onnxruntime.InferenceSession(
        str(exported["onnx"] / "onnx/model.onnx"), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]

    def run(length: int):
        ids = torch.randint(1000, 5000, (1, length), generator=torch.Generator().manual_seed(length))
        feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        return session.run(None, {name: feed[name].numpy() for name in names})[0], feed

    got, feed = run(NEW_LENGTH)  # the whole table: as the torch model
    with torch.no_grad():
        expected = exported["model"][0].auto_model(**feed).last_hidden_state
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(Exception, match="out of data bounds"):  # onnxruntime's Gather, not a clamp to the last row
        run(TOO_LONG)


def set_max_seq_length(folder, length: int) -> None:
    path = folder / "sentence_bert_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_seq_length": length}))


def test_onnx_encoder_refuses_a_text_longer_than_the_model_reads(exported, tmp_path):
    import shutil

    from posswap.onnx.encoder import OnnxEncoder

    folder = shutil.copytree(exported["onnx"], tmp_path / "edited")
    set_max_seq_length(folder, 1000)
    encoder = OnnxEncoder(folder, threads=1)
    assert encoder.encode(["a short sentence"]).shape == (1, 32)
    with pytest.raises(ValueError) as refused:
        encoder.encode(["short", " ".join(["word"] * 300)])
    assert str(refused.value) == (
        f"{folder}: text 1 needs 302 positions but this bert model reads at most {NEW_LENGTH} tokens: set "
        f"max_seq_length in sentence_bert_config.json to {NEW_LENGTH} or less (longer texts are then truncated)."
    )


def test_onnx_encoder_on_a_torch_folder_says_to_export_it(exported):
    from posswap.onnx.encoder import OnnxEncoder

    folder = exported["torch"]
    with pytest.raises(ValueError) as refused:
        OnnxEncoder(folder)
    assert str(refused.value) == (
        f"{folder}: no ONNX graph at onnx/model.onnx (a torch folder?): run `posswap export {folder} --format onnx "
        "--out OUT` first and open OUT."
    )


def test_onnx_encoder_names_a_text_that_is_not_a_string(exported):
    from posswap.onnx.encoder import OnnxEncoder

    encoder = OnnxEncoder(exported["onnx"], threads=1)
    for texts, message in (
        ([None], "text 0 is None, not a string"),
        (["fine", 3], "text 1 is int, not a string"),
    ):
        with pytest.raises(ValueError) as refused:
            encoder.encode(texts)
        assert str(refused.value) == f"{message}: OnnxEncoder.encode takes a string or a list of strings."
