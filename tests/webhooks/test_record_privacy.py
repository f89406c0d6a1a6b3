"""What the record keeps: the two-sided `turns`, text redacted everywhere it is written (event lines, the
agent's per-frame tokens, the `.jsonl` and the `.json`), the call's own numbers kept, a discarded wav gone, and
the recording silenced where either side said something redacted."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from duetaspan.pipeline.artifacts import CallRecorder, load_call_record, update_record
from duetaspan.webhooks.events import call_ended_data
from duetaspan.webhooks.redact import KINDS, Redactor
from tests.support import has_card

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
        assert not has_card(text) and "ann@example.com" not in text and ' one"' not in text, name
    ended = call_ended_data(record)
    assert ended["caller"] == "+14155552671" and ended["recorded"] is True
    assert not has_card(json.dumps(ended)) and ended["tool_calls"][0]["tool"] == "take_payment"


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


def _read_wav(path):
    import wave

    with wave.open(str(path), "rb") as w:
        assert w.getnchannels() == 2 and w.getsampwidth() == 2
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)


def test_the_recording_is_silenced_where_redacted_words_were_said(tmp_path):
    """Word times (caller-stream seconds) of a card number read out: the caller channel of the stored wav is
    zero over them (padded), in frames written before the ASR answered and after; the rest of both channels
    is untouched; the stored words carry `[card]`, never the digits. Two concealed ticks at the start put the
    caller's stream 160 ms behind the wav: the silence follows the caller's audio, not the wav's clock."""
    rng = np.random.default_rng(0)
    rec = CallRecorder(tmp_path, "CA2", redactor=Redactor(["card"]))
    noise = lambda: (rng.standard_normal(1920) * 0.2).astype(np.float32)  # noqa: E731
    rec.write_frame(np.zeros(1920, np.float32), noise(), caller_frame=-1)  # concealed ticks
    rec.write_frame(np.zeros(1920, np.float32), noise(), caller_frame=-1)
    for k in range(30):  # caller frames 0..29 (0-2.4 s of the caller's stream)
        rec.write_frame(noise(), noise(), caller_frame=k)
    words = [("my", 0.2, 0.4), ("card", 0.4, 0.6), ("is", 0.6, 0.7), ("4111", 0.8, 1.2), ("1111", 1.2, 1.6),
             ("1111", 1.6, 2.0), ("1111.", 2.0, 2.6), ("thanks", 2.8, 3.2)]  # fmt: skip
    rec.event("caller_utterance", text=f"my card is {CARD}. thanks", start=0.2, end=3.2,
              words=[{"word": w, "start": s, "end": e} for w, s, e in words])  # fmt: skip
    for k in range(30, 50):  # the rest of the card number, heard after the ASR answered
        rec.write_frame(noise(), noise(), caller_frame=k)
    record = rec.close()
    (span,) = record["audio_redactions"]
    assert (span["start"], span["end"], span["kind"]) == (0.65, 2.75, "card")
    (utterance,) = record["caller_utterances"]
    assert [w["word"] for w in utterance["words"]] == ["my", "card", "is", "[card]", "thanks"]
    assert utterance["text"] == "my card is [card]. thanks"
    assert not has_card((tmp_path / "CA2.jsonl").read_text() + (tmp_path / "CA2.json").read_text())
    pcm = _read_wav(tmp_path / "CA2.wav")
    at = lambda s: 2 * 1920 + round(s * 24000)  # noqa: E731  caller-stream seconds -> wav sample
    assert pcm.shape == (52 * 1920, 2)
    assert not pcm[at(0.65) : at(2.75), 0].any()  # the card number: silence
    before, after = pcm[at(0.0) : at(0.64), 0], pcm[at(2.76) : at(4.0), 0]
    assert np.count_nonzero(before) > 0.99 * before.size and np.count_nonzero(after) > 0.99 * after.size
    assert np.count_nonzero(pcm[:, 1]) > 0.99 * pcm.shape[0]  # the agent's channel is left as it was


def _tick(k: int, caller: np.ndarray, agent: np.ndarray, text: str) -> SimpleNamespace:
    """One engine tick as the host hands it to the recorder (`duetaspan.pipeline.runner.TickOutput`)."""
    result = SimpleNamespace(pcm=agent, text=text, silent=False, is_ret=False, frame_index=k, step_ms=1.0)
    return SimpleNamespace(result=result, caller_pcm=caller, concealed=False, caller_frame=k, call_frame=k,
                           t=k * 0.08, lateness_ms=0.0)  # fmt: skip


def test_both_channels_are_silenced_where_each_side_said_the_card_number(tmp_path):
    """The caller reads a card number (ASR word times) and the agent reads it back (one token per frame): in
    the stored wav the caller channel is zero over the caller's words and the agent channel over the agent's
    tokens' frames (padded: 0.15 s before, `AGENT_TAIL_S` after), each channel intact everywhere else (the
    other side's span too); the record keeps both spans, the digits are in no file."""
    rng = np.random.default_rng(2)
    noise = lambda: (rng.standard_normal(1920) * 0.2).astype(np.float32)  # noqa: E731
    rec = CallRecorder(tmp_path, "CA4", redactor=Redactor(["card"]))
    tokens = {30: " You", 31: " said", 32: " 4111", 33: " 1111", 34: " 1111", 35: " 1111,", 36: " is", 37: " that",
              38: " right?"}  # fmt: skip
    words = [("my", 0.2, 0.3), ("card", 0.3, 0.5), ("is", 0.5, 0.6), ("4111", 0.6, 0.9), ("1111", 0.9, 1.2),
             ("1111", 1.2, 1.4), ("1111", 1.4, 1.6)]  # fmt: skip
    for k in range(60):
        if k == 22:  # the ASR answers after the caller spoke
            rec.event("caller_utterance", text=f"my card is {CARD}", start=0.2, end=1.6,
                      words=[{"word": w, "start": a, "end": b} for w, a, b in words])  # fmt: skip
        rec.tick(_tick(k, noise(), noise(), tokens.get(k, "")))
    record = rec.close()
    spans = [(s["channel"], s["start"], s["end"], s["kind"]) for s in record["audio_redactions"]]
    # caller: its words 0.6-1.6 s, padded 0.15 s; agent: frames 32-35, from 32 * 0.08 - 0.15 to 36 * 0.08 + 0.32
    assert spans == [("caller", 0.45, 1.75, "card"), ("agent", 2.41, 3.2, "card")]
    assert all(s["samples"] > 0 for s in record["audio_redactions"])
    assert "[card]" in record["transcript"] and record["transcript"].startswith("You said")
    for name in ("CA4.json", "CA4.jsonl"):
        assert not has_card((tmp_path / name).read_text()), name
    pcm = _read_wav(tmp_path / "CA4.wav")
    at = lambda s: round(s * 24000)  # noqa: E731  (no concealed ticks: caller stream and wav agree)
    assert pcm.shape == (60 * 1920, 2)
    caller, agent = pcm[:, 0], pcm[:, 1]
    assert not caller[at(0.45) : at(1.75)].any() and not agent[at(2.41) : at(3.2)].any()
    kept = lambda x: np.count_nonzero(x) > 0.99 * x.size  # noqa: E731
    assert kept(caller[: at(0.44)]) and kept(caller[at(1.76) :])  # the caller's channel: only its own span
    assert kept(agent[: at(2.40)]) and kept(agent[at(3.21) :])  # the agent's channel: only its own span


def test_without_word_times_or_redaction_the_recording_is_kept(tmp_path):
    rng = np.random.default_rng(1)
    rec = CallRecorder(tmp_path, "CA3")  # no redactor: words kept, audio kept
    for _ in range(20):
        rec.write_frame((rng.standard_normal(1920) * 0.2).astype(np.float32), np.zeros(1920, np.float32))
    rec.event("caller_utterance", text=CARD, start=0.1, end=1.0,
              words=[{"word": w, "start": 0.1 + i * 0.2, "end": 0.3 + i * 0.2} for i, w in enumerate(CARD.split())])  # fmt: skip
    record = rec.close()
    assert record["audio_redactions"] == [] and record["caller_utterances"][0]["words"][0]["word"] == "4111"
    pcm = _read_wav(tmp_path / "CA3.wav")
    assert np.count_nonzero(pcm[:, 0]) > 0.99 * pcm.shape[0]


def test_each_tick_says_which_caller_frame_it_holds():
    """The host numbers caller frames as they arrive: a dropped backlog and a concealed tick show in it (the
    recording's redaction maps word times through it)."""
    from duetaspan.pipeline.thread_host import SlotQueue

    q = SlotQueue(key=0, slot=0, max_backlog_frames=2)
    for _ in range(4):  # frames 0 and 1 are dropped (backlog bound 2)
        q.push(np.zeros(1920, np.float32))
    took = [q.take() for _ in range(3)]
    assert [(t[1], t[2], t[3]) for t in took] == [(False, 0, 2), (False, 1, 3), (True, 2, None)]
