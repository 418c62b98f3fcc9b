"""The repeated-text-at-a-distance probe on tiny models built here and on stubs whose answer is known
(offline, CPU, a few seconds)."""

from __future__ import annotations

import json
import math
import types

import pytest
import torch
import torch.nn.functional as F
import transformers
from conftest import InputRecorder as Recorder
from torch import nn

from posswap.evaluation import repeat_probe
from posswap.evaluation.plots import plot_repeat
from posswap.evaluation.repeat import draw_trials, repeat_probe_causal, repeat_probe_masked

VOCAB = 100
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tiny_gpt2(seed: int = 0) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def tiny_bert(seed: int = 0) -> transformers.BertForMaskedLM:
    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
    )
    return transformers.BertForMaskedLM(config).eval()


def random_stream(length: int, seed: int = 0, low: int = 0) -> torch.Tensor:
    return torch.randint(low, VOCAB, (length,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def bert_tokenizer(tmp_path_factory):
    """A WordPiece tokenizer with exactly the tiny BERT's 100 ids: the specials, then w0 .. w94."""
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(SPECIALS + [f"w{i}" for i in range(VOCAB - len(SPECIALS))]) + "\n")
    return transformers.BertTokenizerFast(vocab_file=str(path))


class Copier(nn.Module):
    """A causal LM that predicts, at every position, the token ``lag`` back from the one it predicts, when its
    input reaches that far, and is uniform otherwise: it does nothing but copy across ``lag``."""

    def __init__(self, lag: int):
        super().__init__()
        self.lag, self.head = lag, nn.Linear(1, 1)
        self.config = types.SimpleNamespace(
            model_type="copier", is_decoder=True, vocab_size=VOCAB, max_position_embeddings=None
        )

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, VOCAB)
        for t in range(self.lag - 1, input_ids.shape[1] - 1):  # logits at t predict token t + 1
            logits[torch.arange(len(input_ids)), t, input_ids[:, t + 1 - self.lag]] = 50.0
        return types.SimpleNamespace(logits=logits)


def token_nll(model, ids: torch.Tensor) -> torch.Tensor:
    """NLL of tokens 1 .. n-1 of one sequence, by log-softmax and gather (index i: the token at i + 1)."""
    with torch.no_grad():
        log_p = model(input_ids=ids[None]).logits[0, :-1].float().log_softmax(-1)
    return -log_p.gather(1, ids[1:, None])[:, 0]


def find(stream: torch.Tensor, part: torch.Tensor) -> int:
    """The one place ``part`` occurs in ``stream``."""
    hits = (stream.unfold(0, len(part), 1) == part).all(1).nonzero()[:, 0].tolist()
    assert len(hits) == 1, hits
    return hits[0]


# --- causal ------------------------------------------------------------------------------------------------


def test_causal_reference_and_repeat_are_the_right_tokens_of_one_pass():
    span, d, stream = 8, 10, random_stream(500)
    model = Recorder(tiny_gpt2())
    result = repeat_probe_causal(model, stream, span, [d], 1, limit=64, progress=False)
    (sequence,) = torch.cat(model.seen)
    assert len(sequence) == 2 * span + d and torch.equal(sequence[:span], sequence[span + d :])
    a, b = find(stream, sequence[:span]), find(stream, sequence[span : span + d])
    assert a + span <= b or b + d <= a  # span and filler from places that do not overlap
    nll = token_nll(model.model, sequence)  # nll[i] is the token at position i + 1
    assert result["reference"][0] == pytest.approx(nll[0 : span - 1].mean().item(), abs=1e-5)  # positions 1 .. 7
    assert result["repeat"][0] == pytest.approx(nll[span + d : 2 * span + d - 1].mean().item(), abs=1e-5)  # 19 .. 25
    assert result["drop"][0] == pytest.approx(result["reference"][0] - result["repeat"][0])
    assert result["n"] == [1] and result["drop_se"] == [None] and result["read_as"] == ["full"]


def test_trials_of_one_distance_share_batches_and_the_standard_error_is_of_the_drop():
    span, d = 6, 4
    model = Recorder(tiny_gpt2())
    result = repeat_probe_causal(model, random_stream(300), span, [d], 10, limit=64, progress=False)
    assert [len(x) for x in model.seen] == [8, 2]  # BATCH rows, then the rest
    drops = []
    for sequence in torch.cat(model.seen):
        nll = token_nll(model.model, sequence)
        drops.append(nll[: span - 1].mean() - nll[span + d : 2 * span + d - 1].mean())
    drops = torch.stack(drops).double()
    assert result["drop"][0] == pytest.approx(drops.mean().item(), abs=1e-5)
    assert result["drop_se"][0] == pytest.approx((drops.std() / math.sqrt(10)).item(), abs=1e-5)
    assert result["n"] == [10]


def test_past_the_limit_the_sequence_is_read_with_a_sliding_window():
    span, model = 8, Recorder(tiny_gpt2())
    result = repeat_probe(
        model, None, random_stream(500), span=span, distances=[10, 60], spans_per_distance=1, progress=False
    )
    assert result["read_as"] == ["full", "sliding"]  # 26 tokens fit the 64 positions, 76 do not
    assert max(x.shape[1] for x in model.seen) == 64
    (head,), (tail,) = model.seen[1:]  # the 76-token sequence in windows [0, 64) and [32, 76)
    assert len(head) == 64 and len(tail) == 44 and torch.equal(head[32:], tail[:32])
    sequence = torch.cat([head, tail[32:]])
    assert torch.equal(sequence[:span], sequence[span + 60 :])
    first = token_nll(model.model, sequence[:64])
    second = token_nll(model.model, sequence[32:])  # index i: position 33 + i
    assert result["reference"][1] == pytest.approx(first[: span - 1].mean().item(), abs=1e-5)
    assert result["repeat"][1] == pytest.approx(second[69 - 33 : 76 - 33].mean().item(), abs=1e-5)  # 69 .. 75


def test_an_oracle_copier_drops_by_log_vocab_and_not_when_its_window_is_too_short():
    span, d = 8, 24
    copier = Copier(lag=span + d)
    result = repeat_probe(
        copier, None, random_stream(400), span=span, distances=[d], spans_per_distance=5, limit=None, progress=False
    )
    assert result["reference"][0] == pytest.approx(math.log(VOCAB), abs=1e-4)  # nothing to copy yet: uniform
    assert result["repeat"][0] < 1e-6 and result["drop"][0] == pytest.approx(math.log(VOCAB), abs=1e-3)
    blind = repeat_probe(
        copier, None, random_stream(400), span=span, distances=[d], spans_per_distance=5, limit=16, progress=False
    )
    assert blind["read_as"] == ["sliding"] and abs(blind["drop"][0]) < 1e-4  # 16-token windows never see 32 back


def test_same_seed_same_sequences_for_every_model_and_every_set_of_distances():
    stream = random_stream(400)
    a, b, c, other = (Recorder(tiny_gpt2(seed)) for seed in (0, 1, 2, 3))

    def run(model, distances, seed=0):
        return repeat_probe_causal(model, stream, 6, distances, 3, limit=64, seed=seed, progress=False)

    ra, rb = run(a, [5, 20]), run(b, [5, 20])
    assert len(a.seen) == 2 and all(torch.equal(x, y) for x, y in zip(a.seen, b.seen))
    assert ra["reference"] != rb["reference"]  # different models, same text
    run(c, [20])
    assert torch.equal(c.seen[0], a.seen[1])  # a distance's trials do not depend on the others asked
    run(other, [5, 20], seed=1)
    assert not torch.equal(other.seen[0], a.seen[0])


def test_span_and_filler_never_overlap_and_come_in_both_orders():
    stream = torch.arange(40)  # every token tells its place
    orders = set()
    for seed in range(20):
        for span_ids, filler in draw_trials(stream, 7, 30, 5, seed):  # only 3 tokens to spare
            a, b = int(span_ids[0]), int(filler[0])
            assert torch.equal(span_ids, torch.arange(a, a + 7)) and torch.equal(filler, torch.arange(b, b + 30))
            assert a + 7 <= b or b + 30 <= a
            orders.add(a < b)
    assert orders == {True, False}


def test_a_stream_too_short_or_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"span \+ distance = 8 \+ 25 = 33 tokens.*has 30"):
        repeat_probe_causal(tiny_gpt2(), random_stream(30), 8, [5, 25], 1, limit=64, progress=False)
    with pytest.raises(ValueError, match="span must be"):
        repeat_probe_causal(tiny_gpt2(), random_stream(30), 1, [5], 1, limit=64, progress=False)
    with pytest.raises(ValueError, match="distances"):
        repeat_probe_causal(tiny_gpt2(), random_stream(30), 4, [], 1, limit=64, progress=False)
    with pytest.raises(ValueError, match="spans_per_distance"):
        repeat_probe_causal(tiny_gpt2(), random_stream(30), 4, [5], 0, limit=64, progress=False)
    with pytest.raises(ValueError, match="no LM head"):
        repeat_probe(transformers.BertModel(tiny_bert().config), None, random_stream(30), span=4, distances=[5])
    with pytest.raises(ValueError, match="vocabulary of 100"):
        repeat_probe(tiny_gpt2(), None, random_stream(30) + 100, span=4, distances=[5])


# --- masked ------------------------------------------------------------------------------------------------


def mask_places(row: torch.Tensor, mask_id: int) -> set[int]:
    return set((row == mask_id).nonzero()[:, 0].tolist())


def test_masked_conditions_mask_the_right_places_and_score_the_repeat(bert_tokenizer):
    span, d, trials, mask = 10, 5, 2, bert_tokenizer.mask_token_id
    model = Recorder(tiny_bert())
    stream = random_stream(300, low=len(SPECIALS))  # no special token in the text: a mask is one the probe put
    result = repeat_probe_masked(model, bert_tokenizer, stream, span, [d], trials, limit=64, progress=False)
    (batch,) = model.seen  # copy-visible rows, then no-copy rows, in one pass
    assert batch.shape == (2 * trials, 1 + 2 * span + d + 1)
    first, second = 1, 1 + span + d  # after [CLS]
    copies, repeats, references = batch[:trials], [], []
    for copy, hidden in zip(copies, batch[trials:]):
        assert copy[0] == bert_tokenizer.cls_token_id and copy[-1] == bert_tokenizer.sep_token_id
        in_repeat = mask_places(copy, mask)
        offsets = sorted(p - second for p in in_repeat)
        assert len(offsets) == 2 and all(0 <= o < span for o in offsets)  # 15% of 10, in the repeat only
        assert mask_places(hidden, mask) == in_repeat | {first + o for o in offsets}  # same offsets, both copies
        visible = torch.ones(len(copy), dtype=torch.bool)
        visible[list(mask_places(hidden, mask))] = False
        assert torch.equal(copy[visible], hidden[visible])  # the same sequence otherwise
        kept = [o for o in range(span) if o not in offsets]
        assert torch.equal(copy[second + torch.tensor(kept)], copy[first + torch.tensor(kept)])  # the span repeats
        places, gold = second + torch.tensor(offsets), copy[first + torch.tensor(offsets)]  # the first copy is visible
        with torch.no_grad():
            for row, scores in ((copy, repeats), (hidden, references)):
                logits = model.model(input_ids=row[None]).logits[0].float()
                scores.append(F.cross_entropy(logits[places], gold).item())
    assert result["repeat"][0] == pytest.approx(sum(repeats) / trials, abs=1e-5)
    assert result["reference"][0] == pytest.approx(sum(references) / trials, abs=1e-5)
    assert result["kind"] == "masked" and result["read_as"] == ["full"] and result["n"] == [trials]


def test_masked_past_the_limit_reads_pieces_and_the_entry_point_dispatches(bert_tokenizer):
    model = Recorder(tiny_bert())
    stream = random_stream(300, low=len(SPECIALS))
    result = repeat_probe(
        model, bert_tokenizer, stream, span=10, distances=[5, 50], spans_per_distance=2, progress=False
    )
    assert result["kind"] == "masked" and result["read_as"] == ["full", "truncate"]  # 27 and 72 tokens; 64 fit
    assert max(x.shape[1] for x in model.seen) <= 64
    assert json.loads(json.dumps(result, allow_nan=False)) == result


def test_results_are_json_and_the_plot_is_a_png(bert_tokenizer, tmp_path):
    causal = repeat_probe(
        tiny_gpt2(), None, random_stream(300), span=6, distances=[0, 16, 48], spans_per_distance=3, progress=False
    )
    masked = repeat_probe(
        tiny_bert(),
        bert_tokenizer,
        random_stream(300, low=5),
        span=6,
        distances=[0, 16, 48],
        spans_per_distance=1,
        progress=False,
    )
    assert set(causal) == {"kind", "span", "distances", "reference", "repeat", "drop", "drop_se", "n", "read_as"}
    assert json.loads(json.dumps(causal, allow_nan=False)) == causal
    path = plot_repeat({"gpt2": causal, "bert": masked}, 32, tmp_path / "repeat.png")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
