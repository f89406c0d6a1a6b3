"""The tiny trained tokenizer and the SentencePiece wrapper: special ids, determinism, decoding rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from duetaspan.errors import CheckpointError
from duetaspan.model.convention import NON_TEXT_IDS, RET_ID, SPAN_CLOSE_ID, SPAN_OPEN_ID, TEXT_PAD_ID
from duetaspan.model.tokenizer import (
    TINY_VOCAB_SIZE,
    TextTokenizer,
    tiny_corpus,
    tiny_tokenizer_path,
    train_tiny_tokenizer,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer.tiny(tmp_path_factory.mktemp("tok"))


def test_tiny_layout_matches_the_real_model(tok):
    assert tok.vocab_size == TINY_VOCAB_SIZE == 1024
    sp = tok._sp
    assert [sp.id_to_piece(i) for i in range(4)] == ["<unk>", "<s>", "</s>", "<pad>"]
    assert sp.id_to_piece(RET_ID) == "<0x00>"
    assert sp.id_to_piece(SPAN_OPEN_ID) == "<0x08>"
    assert sp.id_to_piece(SPAN_CLOSE_ID) == "<0x09>"
    assert sp.pad_id() == TEXT_PAD_ID


def test_training_is_deterministic_and_cached(tmp_path):
    a = train_tiny_tokenizer(tmp_path / "a.model", tiny_corpus())
    b = train_tiny_tokenizer(tmp_path / "b.model", tiny_corpus())
    assert a.read_bytes() == b.read_bytes()
    cached = tiny_tokenizer_path(tmp_path / "cache")
    mtime = cached.stat().st_mtime_ns
    assert tiny_tokenizer_path(tmp_path / "cache") == cached and cached.stat().st_mtime_ns == mtime
    assert cached.read_bytes() == a.read_bytes()


def test_round_trip_and_pieces(tok):
    text = "What is the weather in Sydney?"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert "".join(tok.piece(i) for i in ids) == " " + text


def test_decode_skips_stream_signals(tok):
    words = tok.encode("hello there")
    mixed = [TEXT_PAD_ID, RET_ID, *words[:1], SPAN_OPEN_ID, 0, *words[1:], SPAN_CLOSE_ID, 1, 2]
    assert tok.decode(mixed) == "hello there"
    assert all(tok.piece(i) == "" for i in NON_TEXT_IDS)


def test_encode_never_emits_signal_ids(tok):
    # a tab is byte 0x09 (the span close piece) and NUL is <ret>: they must never reach the text stream
    ids = tok.encode("a\tb\x00c\x08d")
    assert not set(ids) & NON_TEXT_IDS
    assert tok.is_representable("the weather") and not tok.is_representable("☃")


def test_missing_or_bad_file(tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer not found"):
        TextTokenizer.from_file(tmp_path / "nope.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(CheckpointError, match="not a SentencePiece model"):
        TextTokenizer.from_file(Path(bad))
