"""The reference contract: normalisation, the three trained shapes, the token cap at sentence/word boundaries."""

from __future__ import annotations

import pytest

from duetaspan.model.convention import NON_TEXT_IDS
from duetaspan.model.tokenizer import TextTokenizer
from duetaspan.spans.reference import (
    NO_INFORMATION,
    normalize_reference,
    prepare_reference,
    tool_result,
)


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return TextTokenizer.tiny(tmp_path_factory.mktemp("tok"))


def test_normalisation():
    assert (
        normalize_reference("\u201cHi\u201d \u2014 it\u2019s 22\u2009\u00b0C\u2026")
        == '"Hi" - it\'s 22 °C...'
    )
    assert normalize_reference("a\tb\nc\x00d\x08e\u200b f") == "a b cde f"
    assert normalize_reference("\uff21\uff22\uff23 \ufb01ne") == "ABC fine"  # NFKC: full-width, ligature
    assert normalize_reference("   ") == ""


def test_trained_shapes():
    assert tool_result("the weather is sunny") == "(tool result) the weather is sunny"
    assert tool_result("(tool result) already wrapped") == "(tool result) already wrapped"
    assert tool_result("") == f"(tool result) {NO_INFORMATION}"


def test_empty_reference_gives_no_span(tok):
    ref = prepare_reference(" \t\x00 ", tok)
    assert ref.tokens == () and ref.n_frames == 0 and not ref.truncated


def test_cap_cuts_at_a_sentence_end(tok):
    text = "It is sunny in Sydney. The wind is light. " * 40
    ref = prepare_reference(text, tok, max_tokens=30)
    assert ref.truncated and len(ref.tokens) <= 30 and ref.text.endswith(".")
    assert ref.tokens == tuple(tok.encode(ref.text))
    assert text.startswith(ref.text)
    assert ref.n_frames == len(ref.tokens) + 2


def test_cap_falls_back_to_a_word_boundary(tok):
    text = " ".join(["weather"] * 200)  # no sentence end at all
    ref = prepare_reference(text, tok, max_tokens=25)
    assert ref.truncated and 0 < len(ref.tokens) <= 25
    assert set(ref.text.split()) == {"weather"}  # never a cut word
    with pytest.raises(ValueError):
        prepare_reference("x", tok, max_tokens=0)


def test_characters_outside_the_vocabulary(tok):
    ref = prepare_reference("Caf\u00e9 \u2603 in Z\u00fcrich", tok)
    assert ref.tokens and not set(ref.tokens) & NON_TEXT_IDS
    assert tok.decode(ref.tokens) == "Café ☃ in Zürich"  # byte fallback round-trips
