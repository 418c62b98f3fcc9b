"""Late chunks with the user's pieces, the sentence chunker, and documents longer than the model reads (issue 49;
issue 45 case 6: never a silent cut). References are the transformer's own token outputs pooled by hand over the
tokens whose first character is in each piece."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import posswap
from posswap.data import read_document
from posswap.embeddings.late_chunking import Span, late_chunks_and_documents, window_for_each

st = pytest.importorskip("sentence_transformers")
TEXT = read_document("persuasion")[30000:33000]


@pytest.fixture(scope="module")
def long_model(minilm_path):
    return posswap.patch(st.SentenceTransformer(minilm_path, device="cpu"), posswap.AlibiConfig(max_length=1024))


def token_outputs(model, text: str) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """The whole text read once by the transformer: its token outputs and each text token's character span."""
    tokens = model.tokenizer(text, return_tensors="pt", return_offsets_mapping=True)
    offsets = tokens.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        return model[0].auto_model(**tokens).last_hidden_state[0], offsets


def pooled_by_hand(model, text: str, pieces: list[str]) -> torch.Tensor:
    outputs, offsets = token_outputs(model, text)
    ends, at = [], 0
    for piece in pieces:
        at += len(piece)
        ends.append(at)
    owner = []  # per token position: its piece ([CLS] the first, [SEP] the last)
    for i, (start, end) in enumerate(offsets):
        if start == end == 0 and i in (0, len(offsets) - 1):
            owner.append(0 if i == 0 else len(pieces) - 1)
        else:
            owner.append(next(k for k, e in enumerate(ends) if start < e))
    owner = torch.tensor(owner)
    return torch.stack([F.normalize(outputs[owner == k].mean(0), dim=-1) for k in range(len(pieces))])


def test_one_piece_is_encode_of_the_text(long_model):
    text = TEXT[:1500]
    (vectors,) = posswap.late_chunks(long_model, [text], chunks=[[text]])
    torch.testing.assert_close(vectors, long_model.encode([text], convert_to_tensor=True), atol=1e-6, rtol=0)


def test_each_piece_pools_the_tokens_it_holds_in_the_whole_text(long_model):
    word = next(i for i in range(200, 400) if TEXT[i - 1] == " " and TEXT[i].isalpha())
    pieces = [TEXT[:word], TEXT[word : word + 1], TEXT[word + 1 : 900], TEXT[900:2000]]  # one cut inside a word
    short = ["A short one. ", "And its end."]
    vectors, two = posswap.late_chunks(long_model, ["".join(pieces), "".join(short)], chunks=[pieces, short])
    assert vectors.shape == (4, 384) and two.shape == (2, 384)
    torch.testing.assert_close(vectors, pooled_by_hand(long_model, "".join(pieces), pieces), atol=1e-5, rtol=0)
    torch.testing.assert_close(two, pooled_by_hand(long_model, "".join(short), short), atol=1e-5, rtol=0)


def test_the_late_chunks_pass_gives_each_text_its_encode_embedding(long_model, minilm_path):
    texts = [TEXT[:1500], TEXT[1500:1800]]
    pieces = [posswap.split_text(long_model, t, max_tokens=64) for t in texts]
    late, documents = late_chunks_and_documents(long_model, texts, chunks=pieces)
    torch.testing.assert_close(late[0], posswap.late_chunks(long_model, texts[:1], chunks=pieces[:1])[0])
    torch.testing.assert_close(
        torch.stack(documents), long_model.encode(texts, convert_to_tensor=True), atol=1e-5, rtol=0
    )
    stock = st.SentenceTransformer(minilm_path, device="cpu")  # reads 256 tokens: the first text needs windows
    _, documents = late_chunks_and_documents(stock, texts, chunks=pieces, long_documents="windows")
    assert documents[0] is None and documents[1] is not None
    _, cut = late_chunks_and_documents(stock, texts, chunks=pieces, long_documents="windows", cut_documents=True)
    # a text read in windows: encode's own vector, which cuts it at the model's length
    torch.testing.assert_close(torch.stack(cut), stock.encode(texts, convert_to_tensor=True), atol=1e-5, rtol=0)


def test_split_text_cuts_at_sentence_ends_within_the_budget(long_model):
    pieces = posswap.split_text(long_model, TEXT, max_tokens=64)
    assert "".join(pieces) == TEXT
    sizes = [len(long_model.tokenizer(p)["input_ids"]) for p in pieces]
    assert max(sizes) <= 64 and sum(sizes) > 0.8 * 64 * (len(pieces) - 1)  # full, not shredded
    # Cuts at sentence or paragraph ends, but where a sentence is longer than a piece (one here, Admiral Baldwin's).
    at_ends = [p.rstrip()[-1] in ".!?\"'" or p.endswith("\n\n") for p in pieces[:-1]]
    assert sum(at_ends) >= len(at_ends) - 1 and all(p.endswith((" ", "\n")) for p in pieces[:-1])


def test_split_text_prefers_a_paragraph_end_and_cuts_a_long_sentence_at_words(long_model):
    first = "One short paragraph ends here. " * 3
    text = first.rstrip() + "\n\n" + "Then a sentence that goes on and on " * 20 + "and stops."
    pieces = posswap.split_text(long_model.tokenizer, text, max_tokens=40)
    assert pieces[0] == first.rstrip() + "\n\n"  # the paragraph end, though a sentence end fits later too
    assert "".join(pieces) == text and all(p.endswith(" ") for p in pieces[1:-1])


def test_late_chunk_pieces_returns_each_piece_with_its_text_and_vector(long_model):
    (chunks,) = posswap.late_chunk_pieces(long_model, [TEXT[:2500]], max_tokens=128)
    assert "".join(c.text for c in chunks) == TEXT[:2500]
    assert all(TEXT[c.start : c.end] == c.text for c in chunks)
    expected = pooled_by_hand(long_model, TEXT[:2500], [c.text for c in chunks])
    torch.testing.assert_close(torch.stack([c.vector for c in chunks]), expected, atol=1e-5, rtol=0)


def test_a_document_longer_than_the_model_is_refused_or_read_in_windows(minilm_path):
    stock = st.SentenceTransformer(minilm_path, device="cpu")  # reads 256 tokens
    with pytest.raises(ValueError) as refused:
        posswap.late_chunks(stock, [TEXT], chunk_tokens=64)
    assert "texts[0] is" in str(refused.value) and "long_documents='windows'" in str(refused.value)
    assert "\n" not in str(refused.value)
    pieces = posswap.split_text(stock, TEXT, max_tokens=64)
    (vectors,) = posswap.late_chunks(stock, [TEXT], chunks=[pieces], long_documents="windows")
    assert len(vectors) == len(pieces)  # nothing dropped: 3,000 characters, every piece has its vector
    # A piece's vector is its tokens pooled in the window chosen for it: that window's text read alone.
    ids = stock.tokenizer(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    offsets, limit = ids["offset_mapping"], 254
    k = len(pieces) // 2
    start_char = sum(len(p) for p in pieces[:k])
    first = next(i for i, (s, _) in enumerate(offsets) if s >= start_char)
    last = next(i for i, (s, _) in enumerate(offsets) if s >= start_char + len(pieces[k]))
    (window,) = window_for_each([Span(first, last)], len(offsets), limit)
    window_text = TEXT[offsets[window][0] : offsets[window + limit - 1][1]]
    outputs, _ = token_outputs(stock, window_text)
    expected = F.normalize(outputs[1 + first - window : 1 + last - window].mean(0), dim=-1)
    torch.testing.assert_close(vectors[k], expected, atol=1e-5, rtol=0)


def test_the_window_holds_its_piece_with_the_most_context():
    spans = [Span(0, 10), Span(300, 340), Span(980, 1000), Span(500, 740)]
    windows = window_for_each(spans, 1000, 254)
    for span, start in zip(spans, windows):
        assert start <= span.start and span.end <= start + 254
    assert windows[0] == 0 and windows[2] == 1000 - 254
    assert abs((300 - windows[1]) - (windows[1] + 254 - 340)) <= 127  # near the middle: a half-window grid
    assert window_for_each([Span(0, 5)], 100, 254) == [0]  # a text that fits is read whole


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"chunks": [["a", "b"]], "texts": ["ab", "c"]}, "chunks must be a list with one list of pieces per text (2)"),
        ({"chunks": [["a b"]], "texts": ["a  b"]}, "chunks[0]: the pieces, joined, must be texts[0] exactly"),
        ({"chunks": [["a", " ", "b"]], "texts": ["a b"]}, "chunks[0][1] holds no token"),
        ({"chunks": [[]], "texts": ["a"]}, "chunks[0] must be a non-empty list of strings"),
        ({"chunks": [["a"]], "texts": ["a"], "chunk_tokens": 8}, "chunks and chunk_tokens: give one"),
        ({"long_documents": "truncate"}, "long_documents must be one of refuse, windows; got 'truncate'."),
        ({"batch_size": 0}, "batch_size must be a positive whole number; got 0."),
    ],
)
def test_bad_pieces_are_one_line(long_model, kwargs, message):
    with pytest.raises(ValueError) as refused:
        posswap.late_chunks(long_model, **{"texts": ["a"], **kwargs})
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_tokens": 2}, "max_tokens must leave room for text beside the special tokens; got 2."),
        ({"max_tokens": 1.5}, "max_tokens must be a positive whole number of tokens; got 1.5."),
        ({"text": ["a"]}, "text must be a string; got list."),
    ],
)
def test_bad_split_arguments_are_one_line(long_model, kwargs, message):
    with pytest.raises(ValueError) as refused:
        posswap.split_text(long_model, **{"text": "a b", **kwargs})
    assert str(refused.value) == message
