"""The caller's voice in `duetaspan.testing`: the phrases shipped as package data (small, readable, speech),
text spoken through a TTS command (espeak-ng), and clear errors for an unknown phrase or a failing command."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from duetaspan.testing.audio import (
    PHRASE_DIR,
    PHRASES,
    RATE,
    CallerAudioError,
    phrase_path,
    speech,
    synthesize,
)


def test_shipped_phrases_are_small_speech_with_their_words():
    files = sorted(PHRASE_DIR.iterdir())
    assert sum(f.stat().st_size for f in files) < 200_000  # the package-data budget
    assert {f.stem for f in files if f.suffix == ".ogg"} == set(PHRASES)
    for name in PHRASES:
        pcm = speech(name)
        assert pcm.dtype == np.float32 and 1.5 < len(pcm) / RATE < 6
        assert float(np.sqrt(np.mean(pcm**2))) > 0.01  # not silence
    assert len(speech("greeting", seconds=0.5)) == RATE // 2
    assert PHRASES["book_table"].startswith("I'd like to book a table")


def test_unknown_phrase_and_unreadable_file_name_the_problem(tmp_path):
    with pytest.raises(CallerAudioError, match=r"no caller phrase 'nope' \(shipped: account_balance, "):
        phrase_path("nope")
    (tmp_path / "broken.wav").write_bytes(b"RIFF....")
    with pytest.raises(CallerAudioError, match=r"cannot read caller audio .*broken\.wav"):
        speech(tmp_path / "broken.wav")


def test_a_failing_tts_command_says_what_it_printed():
    script = "import sys; sys.stderr.write('no voice installed'); sys.exit(3)"
    with pytest.raises(CallerAudioError, match=r"exited 3 without writing say\.wav: no voice installed"):
        synthesize("hello", (sys.executable, "-c", script, "{out}", "{text}"))
    with pytest.raises(CallerAudioError, match="TTS command 'no-such-tts-binary' failed"):
        synthesize("hello", ("no-such-tts-binary", "{out}"))


@pytest.mark.skipif(
    shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (apt install espeak-ng)"
)
def test_text_is_spoken_by_espeak_ng():
    pcm = synthesize("Please book a table for four at seven.")
    assert 1.0 < len(pcm) / RATE < 6 and float(np.abs(pcm).max()) > 0.1
