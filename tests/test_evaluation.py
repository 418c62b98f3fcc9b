"""The evaluation harness on tiny models built here (offline, CPU) and on the real MiniLM."""

from __future__ import annotations

import json
import math
import types

import datasets
import matplotlib.image
import pytest
import torch
import transformers
from conftest import InputRecorder as Recorder
from conftest import make_model, token_ids
from torch import nn

import posswap
from posswap.cli import main
from posswap.data import GPT2_TOKENIZER_DIR
from posswap.data.splits import HELDOUT_DOCUMENTS, SPLITS, load_text_dataset
from posswap.evaluation.causal import sliding_losses, window_losses
from posswap.evaluation.masked import mask_windows, masked_lm_scores, with_special_tokens
from posswap.evaluation.passkey import FILLER, QUESTION, TASK, build_prompt, info, passkey_found
from posswap.evaluation.results import Results
from posswap.evaluation.similarity import rotary_similarity
from posswap.evaluation.stream import token_stream, windows

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SEQ_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def gpt2_tokenizer():
    return transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)


@pytest.fixture(scope="module")
def tiny_gpt2(gpt2_tokenizer):
    """A tiny GPT-2 that reads the real GPT-2 vocabulary, with 64 positions."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=64, vocab_size=len(gpt2_tokenizer))
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory):
    """A BERT WordPiece tokenizer with 99 entries, the vocabulary size of conftest's tiny BERT."""
    words = sorted({w.lower().strip(".,;:!?\"'") for w in FILLER.split() + TASK.split()} - {""})
    words += [f"w{i}" for i in range(99 - len(SEQ_VOCAB) - len(words))]
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SEQ_VOCAB + words) + "\n")
    return transformers.BertTokenizer(vocab=str(path))


TEXTS = [(TASK + FILLER) * 40]


# --- data --------------------------------------------------------------------------------------------------


def test_heldout_split_is_never_in_a_training_split():
    heldout = load_text_dataset("posswap:austen-heldout")
    assert heldout["name"] == list(HELDOUT_DOCUMENTS)
    for split in ("train", "austen-train"):
        assert not set(SPLITS[split]) & set(HELDOUT_DOCUMENTS)
    assert len(heldout[0]["text"]) > 100_000  # a whole novel


def test_technical_heldout_is_a_second_unseen_domain():
    technical = load_text_dataset("posswap:technical-heldout")
    assert technical["name"] == ["python-docs"]
    for split in ("train", "austen-train", "austen-heldout"):
        assert "python-docs" not in SPLITS[split]
    assert (
        "def " in technical[0]["text"]
        and ":func:`" not in technical[0]["text"]
        and ".. index::" not in technical[0]["text"]
    )  # markup stripped


def test_standard_error_is_over_windows(tiny_gpt2, gpt2_tokenizer):
    """loss_se: the spread of the per-window mean losses / sqrt(windows), each window one forward pass."""
    results = posswap.evaluate({"tiny": tiny_gpt2}, gpt2_tokenizer, [16, 64], TEXTS, max_tokens=64, progress=False)
    ids = token_stream(TEXTS, gpt2_tokenizer, 64)
    with torch.no_grad():
        means = torch.tensor(
            [tiny_gpt2(input_ids=w[None], labels=w[None]).loss.item() for w in ids.split(16)], dtype=torch.float64
        )
    assert results.models["tiny"].metrics["loss_se"][0] == pytest.approx((means.std() / 2).item(), rel=1e-4)
    assert results.models["tiny"].metrics["loss_windows"][0] == pytest.approx(means.tolist(), rel=1e-5)
    assert results.models["tiny"].metrics["loss_se"][1] is None  # one window: no error to give


def test_paired_gap_is_the_mean_and_error_of_the_differences():
    from posswap.evaluation.harness import paired_gap

    a, b = [5.0, 6.0, 7.0, 8.0], [4.9, 5.8, 6.9, 7.6]  # a model harder on the same windows: gaps 0.1, 0.2, 0.1, 0.4
    gap, se = paired_gap(a, b)
    differences = torch.tensor([0.1, 0.2, 0.1, 0.4], dtype=torch.float64)
    assert gap == pytest.approx(0.2) and se == pytest.approx((differences.std() / 2).item())
    assert se < (torch.tensor(a).std() / 2).item() / 5  # far below either model's own spread
    with pytest.raises(ValueError, match="Paired windows"):
        paired_gap(a, b[:3])


def test_local_files_and_bad_specs(tmp_path):
    (tmp_path / "a.txt").write_text("line one\nline two\n")
    assert load_text_dataset(str(tmp_path / "a.txt"))["text"] == ["line one\nline two\n"]  # one document
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "x"}) + "\n" + json.dumps({"text": "y"}) + "\n")
    assert load_text_dataset(str(tmp_path / "a.jsonl"))["text"] == ["x", "y"]
    datasets.Dataset.from_dict({"text": ["p", "q"]}).to_parquet(str(tmp_path / "a.parquet"))
    assert load_text_dataset(str(tmp_path / "a.parquet"))["text"] == ["p", "q"]
    (tmp_path / "b.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(ValueError, match="no 'text' column"):
        load_text_dataset(str(tmp_path / "b.jsonl"))
    with pytest.raises(ValueError, match="austen-heldout"):
        load_text_dataset("posswap:nope")
    (tmp_path / "a.csv").write_text("text\nx\n")
    with pytest.raises(ValueError, match=r"\.parquet"):
        load_text_dataset(str(tmp_path / "a.csv"))


# --- causal LM ---------------------------------------------------------------------------------------------


def test_perplexity_equals_one_forward_pass_with_labels(tiny_gpt2, gpt2_tokenizer):
    results = posswap.evaluate({"tiny": tiny_gpt2}, gpt2_tokenizer, [48], TEXTS, max_tokens=48, progress=False)
    ids = token_stream(TEXTS, gpt2_tokenizer, 48)[None]
    with torch.no_grad():
        expected = math.exp(tiny_gpt2(input_ids=ids, labels=ids).loss.item())
    assert results.models["tiny"].metrics["ppl"][0] == pytest.approx(expected, rel=1e-5)
    assert results.models["tiny"].metrics["read_as"] == ["full"]


def test_stride_equal_to_window_is_non_overlapping(tiny_gpt2, gpt2_tokenizer):
    run = lambda stride: posswap.evaluate(  # noqa: E731
        {"tiny": tiny_gpt2}, gpt2_tokenizer, [16, 32], TEXTS, stride=stride, max_tokens=128, progress=False
    )
    plain, strided = run(None).models["tiny"].metrics["ppl"], run(16).models["tiny"].metrics["ppl"]
    assert strided[0] == pytest.approx(plain[0], rel=1e-5)
    assert strided[1] != pytest.approx(plain[1], rel=1e-5)  # stride 16 in windows of 32: more context, other loss


def test_sliding_scores_every_token_once_with_context_labels_masked():
    model = make_model("gpt2", "GPT2LMHeadModel")  # 32 positions
    ids = token_ids(100, batch=1)[0]
    scored = sliding_losses(model, ids, window=32, stride=8)
    assert scored.position.tolist() == list(range(1, 100))
    assert int(scored.context[31:].min()) >= 32 - 8  # after the first pass, every token sees >= window - stride
    with torch.no_grad():  # the last pass (begin 72) equals a forward pass with the context labels set to -100
        window = ids[72:][None]
        labels = window.clone()
        labels[:, : -(100 - 96)] = -100
        expected = model(input_ids=window, labels=labels).loss.item()
    assert scored.nll[-4:].mean().item() == pytest.approx(expected, rel=1e-5)


def test_beyond_the_limit_truncate_and_sliding():
    model = make_model("gpt2", "GPT2LMHeadModel")  # 32 positions
    window = token_ids(64, batch=1)[0]
    truncated, how = window_losses(model, window, 32, "truncate", None)
    halves = torch.cat([sliding_losses(model, window[:32], 32, 32).nll, sliding_losses(model, window[32:], 32, 32).nll])
    assert how == "truncate" and torch.allclose(truncated.nll, halves)
    slid, how = window_losses(model, window, 32, "sliding", None)
    assert how == "sliding" and len(slid.nll) == 63 and int(slid.context.max()) == 31
    with pytest.raises(ValueError, match="truncate, sliding"):
        window_losses(model, window, 32, "wrap", None)
    with pytest.raises(ValueError, match="'wrap'"):
        posswap.evaluate({"m": model}, None, [16], TEXTS, beyond="wrap")


def test_a_tokenizer_that_does_not_fit_the_model_is_named(gpt2_tokenizer):
    model = make_model("gpt2", "GPT2LMHeadModel")  # vocabulary of 99
    with pytest.raises(ValueError, match="vocabulary of 99.*--tokenizer"):
        posswap.evaluate({"m": model}, gpt2_tokenizer, [16], TEXTS, progress=False)


# --- masked LM ---------------------------------------------------------------------------------------------


class Oracle(nn.Module):
    """A masked LM that puts all mass on the right token: it looks the masked input up in a table of answers."""

    def __init__(self, answers: dict[tuple, torch.Tensor], vocab: int, limit: int):
        super().__init__()
        self.answers, self.vocab, self.head = answers, vocab, nn.Linear(1, 1)
        self.config = types.SimpleNamespace(model_type="oracle", max_position_embeddings=limit, is_decoder=False)

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids):
        truth = self.answers[tuple(input_ids[0].tolist())]
        return types.SimpleNamespace(logits=torch.nn.functional.one_hot(truth, self.vocab).float()[None] * 100)


def test_same_seed_same_masks_for_two_models(word_tokenizer):
    a, b = (
        Recorder(make_model("bert", "BertForMaskedLM", seed=0)),
        Recorder(make_model("bert", "BertForMaskedLM", seed=1)),
    )
    results = posswap.evaluate({"a": a, "b": b}, word_tokenizer, [16, 32], TEXTS, max_tokens=64, progress=False)
    assert 0 < len(a.seen) == len(b.seen) and all(torch.equal(x, y) for x, y in zip(a.seen, b.seen))
    assert any((x == word_tokenizer.mask_token_id).any() for x in a.seen)
    assert results.models["a"].metrics["mlm_loss"] != results.models["b"].metrics["mlm_loss"]
    content = windows(token_stream(TEXTS, word_tokenizer, 64), 14, 64)
    again = mask_windows([with_special_tokens(w, word_tokenizer) for w in content], word_tokenizer, seed=0)
    other = mask_windows([with_special_tokens(w, word_tokenizer) for w in content], word_tokenizer, seed=1)
    scored = [x for x, labels in again if (labels != -100).any()]  # windows with no mask are not run
    assert all(torch.equal(x, seen[0]) for x, seen in zip(scored, a.seen))
    assert not all(torch.equal(x, y) for (x, _), (y, _) in zip(again, other))


def test_accuracy_of_a_model_that_always_predicts_the_right_token_is_one(word_tokenizer):
    length, budget = 32, 128
    content = windows(token_stream(TEXTS, word_tokenizer, budget), length - 2, budget)
    originals = [with_special_tokens(w, word_tokenizer) for w in content]
    masked = mask_windows(originals, word_tokenizer, seed=0)
    answers = {tuple(ids.tolist()): original for (ids, _), original in zip(masked, originals)}
    oracle = Oracle(answers, len(word_tokenizer), limit=length)
    result = posswap.evaluate({"oracle": oracle}, word_tokenizer, [length], TEXTS, max_tokens=budget, progress=False)
    assert result.models["oracle"].metrics["mlm_accuracy"] == [1.0]
    assert result.models["oracle"].metrics["mlm_loss"][0] < 1e-6
    random_bert = make_model("bert", "BertForMaskedLM")
    scores, _ = masked_lm_scores(random_bert, masked, limit=None)
    assert scores.accuracy < 1.0 and scores.count == sum(int((labels != -100).sum()) for _, labels in masked)


def test_encoder_without_head_gets_a_note(word_tokenizer):
    results = posswap.evaluate({"enc": make_model("bert", "BertModel")}, word_tokenizer, [16], TEXTS, progress=False)
    assert results.models["enc"].kind == "encoder" and set(results.models["enc"].metrics) == {"adjacent_cos"}
    assert "MLM loss needs" in results.table()


def test_adjacent_similarity_of_a_resampled_table_is_higher():
    from posswap.evaluation.similarity import adjacent_similarity

    model = make_model("bert", "BertModel")  # 32 random rows
    table = model.embeddings.position_embeddings.weight.detach()
    posswap.patch(model, posswap.InterpolateConfig(max_length=128, mode="linear"))
    smooth = model.embeddings.position_embeddings.weight.detach()
    assert adjacent_similarity(smooth, 32) > adjacent_similarity(table, 32) + 0.3
    assert adjacent_similarity(table, 64) is None and adjacent_similarity(table[:1].repeat(4, 1), 4) == pytest.approx(
        1.0
    )


# --- passkey -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("length", [256, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_passkey_prompt_has_the_key_once_the_length_and_the_depth(gpt2_tokenizer, length, depth):
    prompt = build_prompt(gpt2_tokenizer, length, depth, key=48213)
    text = gpt2_tokenizer.decode(prompt.prompt_ids)
    assert text.count(info(48213).strip()) == 1 and text.count("48213") == 2
    assert text.startswith(TASK) and text.endswith(QUESTION)
    full = gpt2_tokenizer(text + " 48213", add_special_tokens=False, verbose=False)["input_ids"]
    assert abs(len(full) - length) <= 0.01 * length
    filler_chars = len(text) - len(TASK) - len(QUESTION) - len(info(48213))
    assert (text.index(info(48213)) - len(TASK)) / filler_chars == pytest.approx(depth, abs=0.02)


def test_passkey_is_found_by_an_oracle_and_not_by_noise(gpt2_tokenizer, tiny_gpt2):
    prompt = build_prompt(gpt2_tokenizer, 128, 0.5, key=31337)

    class NextToken(nn.Module):
        def forward(self, input_ids):
            ids = prompt.ids[1:][-input_ids.shape[1] :]  # the true next token at every position
            return types.SimpleNamespace(logits=torch.nn.functional.one_hot(ids, len(gpt2_tokenizer)).float()[None])

    oracle = NextToken()
    oracle.dummy = nn.Parameter(torch.zeros(1))
    assert passkey_found(oracle, prompt, limit=None) and passkey_found(oracle, prompt, limit=64)
    assert not passkey_found(tiny_gpt2, prompt, limit=64)
    with pytest.raises(ValueError, match="depth"):
        build_prompt(gpt2_tokenizer, 128, 1.5, key=1)


# --- similarity, plots, results file, CLI ------------------------------------------------------------------


def test_rotary_similarity_is_the_cosine_of_rotated_copies():
    head_dim, positions = 16, 40
    theta = 10_000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    query = torch.polar(torch.ones(head_dim // 2, dtype=torch.float64), torch.rand(head_dim // 2, dtype=torch.float64))
    rotated = query * torch.polar(
        torch.ones(positions, 1, dtype=torch.float64), torch.arange(positions)[:, None] * theta
    )
    real = torch.view_as_real(rotated).flatten(1)
    cosine = torch.nn.functional.normalize(real, dim=-1) @ torch.nn.functional.normalize(real, dim=-1).t()
    assert torch.allclose(rotary_similarity(positions, head_dim), cosine, atol=1e-10)


def test_plots_are_pngs_and_results_round_trip(tiny_gpt2, gpt2_tokenizer, tmp_path):
    results = posswap.evaluate(
        {"tiny": tiny_gpt2},
        gpt2_tokenizer,
        [64, 128],
        TEXTS,
        max_tokens=128,
        passkey_trials=1,
        passkey_depths=(0.0, 1.0),
        out=tmp_path,
        progress=False,
    )
    names = {p.name for p in tmp_path.glob("*.png")}
    assert names == {"ppl_vs_length.png", "per_position_loss.png", "passkey_tiny.png", "similarity_tiny.png"}
    for path in tmp_path.glob("*.png"):
        assert path.read_bytes()[:8] == PNG_SIGNATURE
        assert matplotlib.image.imread(path).ndim == 3
    assert Results.load(tmp_path / "results.json") == results
    assert results.models["tiny"].metrics["read_as"] == ["full", "truncate"]
    assert "tiny" in results.table() and "128" in results.table().splitlines()[0]


def test_cli_eval_end_to_end(tiny_gpt2, gpt2_tokenizer, tmp_path, capsys):
    tiny_gpt2.save_pretrained(tmp_path / "tiny")
    gpt2_tokenizer.save_pretrained(tmp_path / "tiny")
    out = tmp_path / "report"
    argv = [
        "eval",
        str(tmp_path / "tiny"),
        "--lengths",
        "32",
        "64",
        "128",
        "--max-tokens",
        "256",
        "--beyond",
        "sliding",
        "--passkey-trials",
        "1",
        "--passkey-depths",
        "0",
        "1",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "ppl" in printed and "results.json" in printed
    results = json.loads((out / "results.json").read_text())
    model = results["models"]["tiny"]  # a folder is named by its last part
    assert results["lengths"] == [32, 64, 128] and model["metrics"]["read_as"] == ["full", "full", "sliding"]
    assert model["passkey"]["accuracy"][0] == [None, None]  # 32 tokens cannot hold a passkey prompt
    assert (out / "ppl_vs_length.png").exists()
    assert main(["eval", str(tmp_path / "tiny"), "--lengths", "a,b", "--out", str(out)]) == 2  # commas: one line
    assert main(["eval", str(tmp_path / "tiny"), "--lengths", "32,64", "--out", str(out)]) == 2
    assert "not commas: --lengths 32 64" in capsys.readouterr().err


def test_cli_eval_minilm_without_head_shows_similarity(minilm_path, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["eval", minilm_path, "--lengths", "128", "1024", "--max-tokens", "256", "--out", str(out)]) == 0
    assert "MLM loss needs" in capsys.readouterr().out
    assert [p.name.startswith("similarity_") for p in out.glob("*.png")] == [True]


# --- device ------------------------------------------------------------------------------------------------


def test_device_cpu_works_and_a_bad_device_is_a_clear_error(tiny_gpt2, gpt2_tokenizer, tmp_path, capsys):
    def score(**device):
        return posswap.evaluate(
            {"tiny": tiny_gpt2}, gpt2_tokenizer, [32], TEXTS, max_tokens=64, progress=False, **device
        )

    on_cpu, default = score(device="cpu"), score()  # default: cuda where there is one
    assert on_cpu.models["tiny"].metrics["loss"] == pytest.approx(default.models["tiny"].metrics["loss"], rel=1e-3)
    assert next(tiny_gpt2.parameters()).device.type == "cpu"  # a model handed in goes back where it was
    for bad in ("gpu", "cuda:99"):
        with pytest.raises(ValueError, match=f"device '{bad}' cannot be used here.*use cpu, cuda"):
            score(device=bad)
    tiny_gpt2.save_pretrained(tmp_path / "tiny")
    gpt2_tokenizer.save_pretrained(tmp_path / "tiny")
    argv = [
        "eval",
        str(tmp_path / "tiny"),
        "--lengths",
        "32",
        "--max-tokens",
        "64",
        "--passkey-trials",
        "0",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv + ["--device", "cpu"]) == 0
    assert main(argv + ["--device", "gpu"]) == 2
    assert "device 'gpu' cannot be used here" in capsys.readouterr().err


def test_model_names_that_differ_only_in_what_a_file_name_drops_write_different_plots():
    from posswap.evaluation.plots import slug

    names = ["a b", "a_b", "modèle", "modéle", "tiny"]
    assert len({slug(n) for n in names}) == len(names)
    assert slug("tiny") == "tiny"  # a name that is already a file name stays as it is
