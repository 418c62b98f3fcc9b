"""interpolate's ``exact_short_inputs`` (E5-Base-4k's placement): an input within the original length gives the
stock model's outputs, decided per row of a padded batch; a longer one reads the stride table from position 0;
saved folders carry the code that does it; decoders, other modes and uneven lengths are refused. With
``stride_per_length`` a longer input is read at the widest whole step its length leaves room for."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from conftest import MODELS, OLD_LENGTH, make_model, outputs, reload_and_compare, sharpen_qk, token_ids

import posswap
from posswap.portable.posswap_functional import resample_table
from posswap.portable.posswap_placement import explicit_position_ids, short_input_position_ids

NEW_LENGTH = 4 * OLD_LENGTH
EXACT = posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="stride", exact_short_inputs=True)
STRIDE = posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="stride")
PER_LENGTH = posswap.InterpolateConfig(
    max_length=NEW_LENGTH, mode="stride", exact_short_inputs=True, stride_per_length=True
)
ENCODERS = [(model_type, head) for model_type, head in MODELS if model_type != "gpt2"]
ENCODER_IDS = [head for _, head in ENCODERS]


def stock_and_patched(model_type: str, head: str):
    stock = sharpen_qk(make_model(model_type, head))  # q.k large enough that positions show in the outputs
    return stock, posswap.patch(copy.deepcopy(stock), EXACT), posswap.patch(copy.deepcopy(stock), STRIDE)


@pytest.mark.parametrize("model_type,head", ENCODERS, ids=ENCODER_IDS)
def test_inputs_within_the_original_length_give_the_stock_outputs(model_type, head):
    stock, exact, stride = stock_and_patched(model_type, head)
    for length in (5, OLD_LENGTH):
        ids = token_ids(length)
        expected = outputs(stock, ids)
        torch.testing.assert_close(outputs(exact, ids), expected, atol=1e-5, rtol=0)
        # The plain stride placement reads interpolated rows there: the property is the option's, not the table's.
        with torch.no_grad():  # the encoder's outputs: a random classifier head is too flat to show it
            stock_hidden = stock.base_model(input_ids=ids).last_hidden_state
            moved = (stride.base_model(input_ids=ids).last_hidden_state - stock_hidden).abs().max()
        assert moved > 1e-2 * stock_hidden.abs().max()


@pytest.mark.parametrize("model_type,head", ENCODERS, ids=ENCODER_IDS)
def test_longer_inputs_read_the_new_table_from_position_zero(model_type, head):
    _, exact, stride = stock_and_patched(model_type, head)
    ids = token_ids(OLD_LENGTH + 1)
    torch.testing.assert_close(outputs(exact, ids), outputs(stride, ids), atol=0, rtol=0)


@pytest.mark.parametrize("model_type,head", [("bert", "BertModel"), ("roberta", "RobertaModel")])
def test_each_row_of_a_padded_batch_is_placed_by_its_own_length(model_type, head):
    stock, exact, stride = stock_and_patched(model_type, head)
    pad = stock.config.pad_token_id or 0
    long, short = token_ids(OLD_LENGTH + 9, batch=1)[0], token_ids(10, batch=1, seed=4)[0]
    batch = torch.full((2, long.numel()), pad)
    batch[0], batch[1, :10] = long, short
    mask = (batch != pad).long()
    with torch.no_grad():
        out = exact(input_ids=batch, attention_mask=mask).last_hidden_state
        alone_short = stock(input_ids=short[None]).last_hidden_state[0]
        alone_long = stride(input_ids=long[None]).last_hidden_state[0]
    torch.testing.assert_close(out[1, :10], alone_short, atol=1e-5, rtol=0)
    torch.testing.assert_close(out[0], alone_long, atol=1e-5, rtol=0)


def hidden(model, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


@pytest.mark.parametrize("model_type,head", [("bert", "BertModel"), ("roberta", "RobertaModel")])
def test_explicit_position_ids_within_the_original_length_give_the_stock_outputs(model_type, head):
    """The caller's own ids (two packed texts, a shifted numbering) read the rows the stock model reads at them."""
    stock, exact, stride = stock_and_patched(model_type, head)
    offset = stock.config.pad_token_id + 1 if model_type == "roberta" else 0
    ids = token_ids(12)
    packed = torch.cat([torch.arange(5), torch.arange(7)])[None] + offset
    shifted = torch.stack([torch.arange(12) + 3, torch.arange(12) + OLD_LENGTH - 12]) + offset  # the last row ends
    for positions in (packed, shifted):  # at the original table's last row
        expected = hidden(stock, input_ids=ids, position_ids=positions)
        torch.testing.assert_close(hidden(exact, input_ids=ids, position_ids=positions), expected, atol=1e-5, rtol=0)
        moved = (hidden(stride, input_ids=ids, position_ids=positions) - expected).abs().max()
        assert moved > 1e-2 * expected.abs().max()  # the stride table itself reads other rows there


def test_explicit_position_ids_past_the_original_length_read_the_new_table():
    _, exact, stride = stock_and_patched("bert", "BertModel")
    ids = token_ids(8)
    positions = torch.stack([torch.arange(8), torch.arange(8) + OLD_LENGTH - 4])  # row 1 reaches past it
    got = hidden(exact, input_ids=ids, position_ids=positions)
    torch.testing.assert_close(got[1], hidden(stride, input_ids=ids, position_ids=positions)[1], atol=0, rtol=0)
    torch.testing.assert_close(got[0], hidden(exact, input_ids=ids)[0], atol=1e-6, rtol=0)  # row 0: 0..7 placed


def test_explicit_position_ids_of_a_padded_row_are_placed_by_its_real_tokens():
    stock, exact, _ = stock_and_patched("bert", "BertModel")
    ids, mask = token_ids(10), torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    positions = torch.arange(10).repeat(2, 1)
    positions[1, 6:] = OLD_LENGTH + 50  # pads numbered past the original length: the real tokens are short
    got = hidden(exact, input_ids=ids, attention_mask=mask, position_ids=positions)
    alone = hidden(stock, input_ids=ids[1:, :6])
    torch.testing.assert_close(got[1, :6], alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type,head", [("bert", "BertForMaskedLM"), ("roberta", "RobertaForMaskedLM")])
def test_a_saved_folder_carries_the_placement(model_type, head, tmp_path):
    stock, exact, _ = stock_and_patched(model_type, head)
    loaded = reload_and_compare(exact, tmp_path, OLD_LENGTH)
    assert type(loaded).__name__ == "Posswap" + head  # the class that installs the placement when built
    torch.testing.assert_close(outputs(loaded, token_ids(OLD_LENGTH)), outputs(stock, token_ids(OLD_LENGTH)))
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == f"posswap-{model_type}" and saved["posswap"]["exact_short_inputs"] is True
    assert (tmp_path / "modeling_posswap.py").is_file()  # test_portable loads it where posswap is not installed


def test_the_sentence_transformers_path_places_short_texts(tmp_path, minilm_path):
    from test_sentence_transformers import embed, tiny_sentence_transformer

    stock = tiny_sentence_transformer(tmp_path / "st", minilm_path)
    texts = ["a short text", "one more, a little longer than that"]
    expected = embed(stock, texts)
    patched = posswap.patch(stock, posswap.InterpolateConfig(max_length=128, mode="stride", exact_short_inputs=True))
    torch.testing.assert_close(embed(patched, texts), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "model_type,head,config,message",
    [
        ("gpt2", "GPT2LMHeadModel", EXACT, "for encoders"),
        (
            "bert",
            "BertModel",
            posswap.InterpolateConfig(max_length=3 * OLD_LENGTH + 1, mode="stride", exact_short_inputs=True),
            "multiple",
        ),
    ],
    ids=["decoder", "uneven-length"],
)
def test_refused_before_anything_changes(model_type, head, config, message):
    model = make_model(model_type, head)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=message):
        posswap.patch(model, config)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert getattr(model.config, "posswap", None) is None


# Real tokens -> the step a row is read at, by hand for 32 -> 128 rows (k = 4): 128 // n, at least 1, at most 4.
HAND_STEPS = {5: 4, 32: 4, 33: 3, 42: 3, 43: 2, 64: 2, 65: 1, 128: 1}


@pytest.mark.parametrize("offset,pad", [(0, 0), (2, 1)], ids=["bert", "roberta"])
def test_per_length_steps_by_hand(offset, pad):
    block = {**PER_LENGTH.to_dict(), "original_length": OLD_LENGTH}
    lengths = list(HAND_STEPS)
    tokens, mask = torch.full((len(lengths), NEW_LENGTH), pad), torch.zeros(len(lengths), NEW_LENGTH, dtype=torch.long)
    for row, n in enumerate(lengths):
        tokens[row, :n], mask[row, :n] = 7, 1
    ids = short_input_position_ids(tokens, mask, block, offset, NEW_LENGTH + offset, pad_token_id=pad)
    for row, n in enumerate(lengths):
        assert ids[row, :n].tolist() == [offset + HAND_STEPS[n] * i for i in range(n)], n
    # The caller's ids: a row of two packed texts reaching 41 (42 tokens' room) reads them at steps of 3, a row
    # reaching 65 as given.
    given = torch.stack([torch.cat([torch.arange(20), torch.arange(42)]), torch.arange(62) + 4]) + offset
    placed = explicit_position_ids(given, tokens[:2, :62], None, block, offset)
    assert placed.tolist() == [[offset + 3 * (i - offset) for i in given[0].tolist()], given[1].tolist()]


def test_per_length_model_reads_the_stride_table_at_its_step(tmp_path):
    stock, _, stride = stock_and_patched("bert", "BertForMaskedLM")
    per_length = posswap.patch(copy.deepcopy(stock), PER_LENGTH)
    short = token_ids(OLD_LENGTH)
    torch.testing.assert_close(outputs(per_length, short), outputs(stock, short), atol=1e-5, rtol=0)
    ids = token_ids(50)  # 128 // 50 = 2: the stride table at positions 0, 2, 4, ...
    expected = stride(input_ids=ids, position_ids=torch.arange(50)[None] * 2).logits
    torch.testing.assert_close(outputs(per_length, ids), expected, atol=1e-5, rtol=0)
    assert (outputs(per_length, ids) - outputs(stride, ids)).abs().max() > 1e-3  # not the plain placement
    loaded = reload_and_compare(per_length, tmp_path, 50)
    assert json.loads((tmp_path / "config.json").read_text())["posswap"]["stride_per_length"] is True
    torch.testing.assert_close(outputs(loaded, ids), expected, atol=1e-5, rtol=0)


def test_per_length_needs_exact_short_inputs():
    with pytest.raises(ValueError, match="stride_per_length needs exact_short_inputs"):
        posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="stride", stride_per_length=True)


def test_needs_the_stride_mode():
    with pytest.raises(ValueError, match="exact_short_inputs needs mode 'stride'"):
        posswap.InterpolateConfig(max_length=NEW_LENGTH, mode="linear", exact_short_inputs=True)


def test_no_native_export(tmp_path):
    _, exact, _ = stock_and_patched("bert", "BertModel")
    with pytest.raises(ValueError, match="exact_short_inputs"):
        posswap.export(exact, tmp_path / "native")
    assert not (tmp_path / "native").exists()


def test_stride_blocks_read_each_block_of_the_table_at_its_own_step(tmp_path):
    # max_length 4 * OLD in two blocks: each the 2 * OLD-row stride table, the second plus 2/3 (e_2 - e_1).
    stock = sharpen_qk(make_model("bert", "BertForMaskedLM"))
    blocks = posswap.patch(copy.deepcopy(stock), dataclasses.replace(PER_LENGTH, stride_blocks=2))
    old = stock.bert.embeddings.position_embeddings.weight.detach()
    half = resample_table(old, 2 * OLD_LENGTH, "stride")
    by_hand = torch.cat([half, half + (old[2] - old[1]) * (0.4 / 0.6)])
    torch.testing.assert_close(blocks.bert.embeddings.position_embeddings.weight.detach(), by_hand)
    plain = copy.deepcopy(stock)  # the stock model reading the hand-made table at the positions it is given
    plain.bert.embeddings.position_embeddings = torch.nn.Embedding.from_pretrained(by_hand)
    with torch.no_grad():
        # Within the old length: the old rows (step 2 in the first block); within a block: step 1; past it too.
        for length, step in ((OLD_LENGTH, 2), (OLD_LENGTH + 8, 1), (3 * OLD_LENGTH, 1)):
            ids = token_ids(length)
            positions = torch.arange(length)[None].expand(2, -1) * step
            expected = plain(input_ids=ids, position_ids=positions, token_type_ids=torch.zeros_like(ids)).logits
            torch.testing.assert_close(outputs(blocks, ids), expected, atol=1e-5, rtol=0)
        short = token_ids(OLD_LENGTH)
        torch.testing.assert_close(outputs(blocks, short), outputs(stock, short), atol=1e-5, rtol=0)
    loaded = reload_and_compare(blocks, tmp_path, 3 * OLD_LENGTH)
    assert loaded.config.posswap["stride_blocks"] == 2


def test_a_table_in_stride_blocks_is_not_re_patched():
    blocks = posswap.patch(make_model("bert", "BertModel"), dataclasses.replace(PER_LENGTH, stride_blocks=2))
    before = blocks.embeddings.position_embeddings.weight.detach().clone()
    with pytest.raises(ValueError, match="laid out in 2 stride blocks"):
        posswap.patch(blocks, posswap.InterpolateConfig(max_length=2 * NEW_LENGTH, mode="stride"))
    assert torch.equal(blocks.embeddings.position_embeddings.weight, before)  # nothing half-done
