"""The length limit holds on every route into a sentence-transformers model, and posswap's loader names the file it
would otherwise hand sentence-transformers broken (issue 28).

sentence-transformers 6 calls its transformer's ``forward`` itself, past the model's hooks: before, a folder whose
``sentence_bert_config.json`` said ``max_seq_length: 9999`` encoded 3,002 tokens with a 2048-token ALiBi model and
gave an embedding with no word. Every route is tried here: a model patched in memory (a stock class), a folder
loaded by ``posswap.from_pretrained``, and the folder loaded by sentence-transformers alone with
``trust_remote_code`` (in a subprocess without posswap). Tiny BERT sentence-transformers (32 -> 128 positions).
"""

from __future__ import annotations

import inspect
import json
import shutil
import textwrap

import pytest
import torch
import transformers
from conftest import run_without_posswap
from test_common import FACTORIES
from test_sentence_transformers import TINY_NEW, tiny_sentence_transformer

import posswap
from posswap import cli

st = pytest.importorskip("sentence_transformers")
pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore:posswap. NoPE"),
]

TOO_LONG = " ".join(["word"] * 300)  # 302 tokens with [CLS] and [SEP]: past 128
LIMIT = "needs 302 positions but this bert model reads at most 128 tokens"


@pytest.fixture(scope="module")
def folders(tmp_path_factory, minilm_path):
    """Every method patched to 128 positions, saved as a sentence-transformers folder."""
    root = tmp_path_factory.mktemp("limits")
    saved = {}
    for method, factory in FACTORIES.items():
        model = tiny_sentence_transformer(root / f"{method}-base", minilm_path)
        posswap.patch(model, factory(TINY_NEW))
        model.save(str(root / method))
        saved[method] = root / method
    return saved


def set_max_seq_length(folder, length: int) -> None:
    path = folder / "sentence_bert_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_seq_length": length}))


@pytest.mark.parametrize("method", FACTORIES)
def test_a_model_patched_in_memory_refuses_what_it_does_not_read(minilm_path, tmp_path, method):
    model = posswap.patch(tiny_sentence_transformer(tmp_path, minilm_path), FACTORIES[method](TINY_NEW))
    short = model.encode(["a short sentence"], convert_to_tensor=True)
    model.max_seq_length = 1000  # the user raises it past the model's limit
    with pytest.raises(ValueError, match=LIMIT):
        model.encode([TOO_LONG])
    # Within the limit nothing changed.
    torch.testing.assert_close(model.encode(["a short sentence"], convert_to_tensor=True), short, atol=0, rtol=0)


@pytest.mark.parametrize("method", FACTORIES)
def test_posswap_refuses_a_max_seq_length_past_the_block_at_load(folders, tmp_path, method):
    folder = shutil.copytree(folders[method], tmp_path / "edited")
    set_max_seq_length(folder, 9999)
    if method == "interpolate":  # a stock folder of a new size: nothing of posswap's to hold it to
        return
    with pytest.raises(ValueError) as refused:
        posswap.from_pretrained(str(folder))
    assert str(refused.value) == (
        f"{folder}: sentence_bert_config.json says max_seq_length 9999 but this model reads at most 128 tokens "
        "(its posswap block's max_length): set max_seq_length to 128 or less."
    )


@pytest.mark.parametrize("method", FACTORIES)
def test_a_folder_loaded_by_posswap_refuses_what_it_does_not_read(folders, method):
    model = posswap.from_pretrained(str(folders[method]))
    model.max_seq_length = 1000
    with pytest.raises(ValueError, match=LIMIT):
        model.encode([TOO_LONG])
    if method == "interpolate":  # a stock class, which fails itself past its table when forward is called directly
        return
    # A caller of forward itself (sentence-transformers, peft's LoraModel) is held too, with the stock signature.
    transformer = model[0].auto_model
    with pytest.raises(ValueError, match="needs 302 positions"):
        transformer.forward(input_ids=torch.ones(1, 302, dtype=torch.long))
    assert inspect.signature(type(transformer).forward) == inspect.signature(transformers.BertModel.forward)


ENCODER = textwrap.dedent("""
    import json, sys
    from sentence_transformers import SentenceTransformer
    results = {}
    for name, folder in json.loads(sys.argv[1]).items():
        model = SentenceTransformer(folder, device="cpu", trust_remote_code=True)
        try:
            model.encode([" ".join(["word"] * 300)])
            results[name] = f"encoded {model.max_seq_length}"
        except ValueError as error:
            results[name] = str(error)
    print(json.dumps(results))
""")


def test_sentence_transformers_alone_refuses_what_the_model_does_not_read(folders, tmp_path):
    """The edited folders loaded where posswap cannot be imported: the code beside the weights holds the limit."""
    edited = {}
    for method, folder in folders.items():
        if method == "interpolate":
            continue
        edited[method] = str(shutil.copytree(folder, tmp_path / method))
        set_max_seq_length(tmp_path / method, 9999)
    stdout = run_without_posswap(ENCODER, json.dumps(edited), modules=tmp_path / "modules")
    results = json.loads(stdout.strip().splitlines()[-1])
    assert {name: LIMIT in message for name, message in results.items()} == dict.fromkeys(edited, True), results


def test_a_missing_pooling_config_is_named(folders, tmp_path):
    folder = shutil.copytree(folders["rope"], tmp_path / "no-pooling")
    shutil.rmtree(folder / "1_Pooling")
    with pytest.raises(ValueError) as refused:
        posswap.from_pretrained(str(folder))
    assert str(refused.value).startswith(f"{folder}: 1_Pooling/config.json is missing, and modules.json lists")


@pytest.mark.parametrize("method", ["interpolate", "alibi"])  # a stock folder and a patched one
def test_a_pooling_width_that_disagrees_with_the_model_is_named(folders, tmp_path, method):
    folder = shutil.copytree(folders[method], tmp_path / "wide")
    path = folder / "1_Pooling" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "embedding_dimension": 768}))
    with pytest.raises(ValueError) as refused:
        posswap.from_pretrained(str(folder))
    assert str(refused.value) == (
        f"{folder}: 1_Pooling/config.json says embedding_dimension 768 but the transformer (./config.json) gives "
        "vectors of 32: set it to 32."
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--task", "passkey-retrieval", "--lengths", "1000000000"],
            "lengths: 100 documents at each of 1000000000 tokens are 100,000,000,000 tokens of text to build and "
            "encode, over the 33,554,432 one evaluation takes: give shorter lengths or fewer documents.",
        ),
        (
            [
                "--task",
                "needle-retrieval",
                "--lengths",
                "256",
                "300000",
                "--documents",
                "10",
                "--baselines",
                "chunk-max",
            ],
            "lengths: 300000 tokens is longer than the persuasion haystack (104116 tokens of this tokenizer), whose "
            "text would repeat: give lengths up to 104116, or a longer haystack.",
        ),
    ],
)
def test_retrieval_lengths_past_what_they_would_cost_are_one_line(minilm_path, tmp_path, capsys, flags, message):
    out = tmp_path / "eval"
    assert cli.main(["eval", minilm_path, *flags, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"posswap eval: error: {message}"
    assert not out.exists()
