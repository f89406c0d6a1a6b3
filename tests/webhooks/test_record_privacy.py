"""What the record keeps: the two-sided `turns`, text redacted everywhere it is written (event lines, the
agent's per-frame tokens, the `.jsonl` and the `.json`), the call's own numbers kept, and a discarded wav gone."""

from __future__ import annotations

import json

import numpy as np

from duetaspan.pipeline.artifacts import CallRecorder, load_call_record, update_record
from duetaspan.webhooks.events import call_ended_data
from duetaspan.webhooks.redact import KINDS, Redactor

CARD = "4111 1111 1111 1111"
SPOKEN = " four" + " one" * 15


def _call(tmp_path, redactor=None, audio=True) -> CallRecorder:
    rec = CallRecorder(tmp_path, "CA1", meta={"caller": "+14155552671", "called": "+14155550000",
                                               "transport": "twilio"}, audio=audio, redactor=redactor)  # fmt: skip
    silence = np.zeros(1920, np.float32)
    words = [" Your", " card", " please."] + [""] * 20 + [" I", " have"] + SPOKEN.split(" ")[1:]
    words = [w if not w or w.startswith(" ") else " " + w for w in words]
    for i, word in enumerate(words):
        rec.write_frame(silence, silence)
        rec.event("frame", i=i, t=round(i * 0.08, 3), text=word)
    rec.event("caller_utterance", text=f"it is {CARD}, mail me at ann@example.com", start=0.5, end=1.4)
    rec.event(
        "span", tool="take_payment", arguments={"card": CARD.replace(" ", "")}, reference="charged", t=2.0
    )
    return rec


def test_turns_are_two_sided_and_ordered(tmp_path):
    record = _call(tmp_path).close(ended_by="caller")
    assert [(t["who"], t["text"]) for t in record["turns"]] == [
        ("agent", "Your card please."),
        ("caller", f"it is {CARD}, mail me at ann@example.com"),
        ("agent", "I have four" + " one" * 15),
    ]
    first, caller = record["turns"][0], record["turns"][1]
    assert first["start"] == 0.0 and first["end"] == 0.24 and caller["start"] == 0.5 and caller["end"] == 1.4
    assert load_call_record(tmp_path, "CA1")["turns"] == record["turns"]


def test_redaction_reaches_every_stored_copy_and_keeps_the_numbers(tmp_path):
    record = _call(tmp_path, Redactor(KINDS)).close(ended_by="caller")
    assert [t["text"] for t in record["turns"]] == [
        "Your card please.",
        "it is [card], mail me at [email]",
        "I have [card]",
    ]
    assert (
        record["spans"][0]["arguments"] == {"card": "[card]"} and record["spans"][0]["tool"] == "take_payment"
    )
    assert record["meta"]["caller"] == "+14155552671"  # the call's own number: index, DNC, deletes
    assert "one one" not in record["transcript"] and record["transcript"].endswith("[card]")
    for name in ("CA1.json", "CA1.jsonl"):
        text = (tmp_path / name).read_text()
        assert "4111" not in text and "ann@example.com" not in text and ' one"' not in text, name
    ended = call_ended_data(record)
    assert ended["caller"] == "+14155552671" and ended["recorded"] is True
    assert "4111" not in json.dumps(ended) and ended["tool_calls"][0]["tool"] == "take_payment"


def test_without_redaction_the_record_is_verbatim(tmp_path):
    record = _call(tmp_path).close()
    assert CARD in json.dumps(record) and record["spans"][0]["arguments"]["card"] == CARD.replace(" ", "")


def test_discarded_audio_is_deleted_and_the_record_says_so(tmp_path):
    rec = _call(tmp_path)
    assert rec.wav_path is not None and rec.wav_path.stat().st_size > 44
    wav = rec.wav_path
    rec.discard_audio("consent_refused")
    rec.write_frame(np.ones(1920, np.float32), np.ones(1920, np.float32))  # later frames: not written
    record = rec.close()
    assert not wav.exists() and not list(tmp_path.glob("*.wav"))
    assert record["recording"] == {"recorded": False, "reason": "consent_refused"}
    assert call_ended_data(record)["recorded"] is False


def test_update_record_adds_fields_atomically(tmp_path):
    _call(tmp_path).close()
    update_record(tmp_path, "CA1", analysis={"summary": "s", "attempts": 1})
    assert load_call_record(tmp_path, "CA1")["analysis"]["summary"] == "s"
    assert not list(tmp_path.glob("*.tmp"))
