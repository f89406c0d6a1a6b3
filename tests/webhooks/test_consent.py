"""Recording consent on a real call of a tiny-random agent (`scripted_call`, in-process line): the notice is
what the caller hears first and what the recording's agent channel holds, sample for sample; a refusal by
DTMF or by a spoken "no" deletes the wav written since the first frame (the test asserts the file is gone) and
the record says so; `announce` plays the notice and keeps recording; a text notice goes through a real TTS
(espeak-ng) and a real Whisper hears its words in the recording; config refuses a consent without a notice
and a TTS command that fails or writes no audio."""

from __future__ import annotations

import asyncio
import shutil
import sys

import numpy as np
import pytest
import soundfile

from duetaspan import Agent
from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError
from duetaspan.pipeline.artifacts import read_events
from duetaspan.testing import scripted_call
from duetaspan.webhooks.consent import Consent, load_notice
from tests.adapters.asr.test_whisper import wer

RATE = 24_000


def _notice(tmp_path) -> np.ndarray:
    t = np.arange(int(RATE * 0.8)) / RATE
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)  # 0.8 s: 10 frames
    soundfile.write(tmp_path / "notice.wav", tone, RATE, subtype="FLOAT")
    return tone


def _agent(tmp_path, tiny_engine, mode: str) -> Agent:
    config = AgentConfig.from_dict(
        {"recording": {"consent": mode, "consent_audio": "notice.wav", "consent_refuse_digits": "29",
                       "consent_window_s": 30}},
        base_dir=tmp_path,
    )  # fmt: skip
    return Agent(config=config, engine=tiny_engine, seed=0, record_dir=tmp_path / "rec", router=False)


async def _frames_written(call, n: int) -> None:
    for _ in range(600):
        if call.session.service.recorder.frames >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {n} frames written")


async def test_ask_refused_by_dtmf_deletes_the_recording(tmp_path, tiny_engine):
    _notice(tmp_path)
    agent = _agent(tmp_path, tiny_engine, "ask")
    async with scripted_call(agent, call_id="CA-refuse") as call:
        await _frames_written(call, 14)
        wav = tmp_path / "rec" / "CA-refuse.wav"
        assert wav.exists() and wav.stat().st_size >= 44 + 14 * 1920 * 4  # recorded from the first frame
        await call.press("9")
        for _ in range(200):
            if not wav.exists():
                break
            await asyncio.sleep(0.05)
        assert not wav.exists()  # deleted during the call
        await call.silence(0.3)
    record = call.record
    assert not list((tmp_path / "rec").glob("*.wav"))  # and not written again
    assert record["recording"] == {"recorded": False, "reason": "consent_refused"}
    assert record["complete"] is True and record["summary"]["frames"] > 14


async def test_announce_plays_the_notice_word_for_word_first_and_records(tmp_path, tiny_engine):
    tone = _notice(tmp_path)
    agent = _agent(tmp_path, tiny_engine, "announce")
    async with scripted_call(agent, call_id="CA-notice") as call:
        await _frames_written(call, 12)
        await call.press("9")  # announce: nothing to refuse
    pcm, rate = soundfile.read(tmp_path / "rec" / "CA-notice.wav", dtype="float32")
    assert rate == RATE
    agent_channel = pcm[: tone.size, 1]
    assert np.max(np.abs(agent_channel - tone)) < 1e-4  # the notice, sample for sample (16-bit)
    assert call.record["recording"]["recorded"] is True
    [consent] = [e for e in read_events(tmp_path / "rec" / "CA-notice.jsonl") if e["type"] == "consent"]
    assert consent["mode"] == "announce" and consent["notice_s"] == 0.8


def test_a_spoken_no_refuses_only_within_the_window():
    c = Consent("ask", np.ones(1920, np.float32), refuse_digits="2", window_s=5.0, recorder=None)

    c.t = 0.0
    c.heard("no problem")
    assert not c.refused
    c._window_end = 5.0
    c.t = 6.0
    c.heard("no")
    c.pressed("2")
    assert not c.refused  # the window has passed
    c.t = 1.0
    c.heard("No, don't record this")
    assert c.refused


def test_consent_needs_a_notice(tmp_path):
    with pytest.raises(ConfigError, match="needs the notice"):
        AgentConfig.from_dict({"recording": {"consent": "ask"}})
    cfg = AgentConfig.from_dict({"recording": {"consent": "announce", "consent_audio": "missing.wav"}},
                                base_dir=tmp_path)  # fmt: skip
    with pytest.raises(ConfigError, match="cannot read"):
        load_notice(cfg.recording)


async def test_ask_refused_by_a_spoken_no_deletes_the_recording(tmp_path, tiny_engine, scripted_asr):
    _notice(tmp_path)
    agent = _agent(tmp_path, tiny_engine, "ask")
    async with scripted_call(agent, call_id="CA-no", asr=scripted_asr) as call:
        await _frames_written(call, 10)
        await call.say("No, don't record this call.")
        for _ in range(300):
            if not (tmp_path / "rec" / "CA-no.wav").exists():
                break
            await asyncio.sleep(0.05)
    assert not (tmp_path / "rec" / "CA-no.wav").exists()
    assert call.record["recording"] == {"recorded": False, "reason": "consent_refused"}
    assert [t["text"] for t in call.record["turns"] if t["who"] == "caller"] == ["No, don't record this call."]


NOTICE_WORDS = "This call is recorded for quality and training."


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (Debian's espeak-ng)")
async def test_a_text_notice_is_rendered_by_the_tts_command_and_heard_word_for_word(
    tmp_path, tiny_engine, whisper_asr
):
    """`consent_text` through a real TTS (espeak-ng, which writes 22.05 kHz): rendered once at start, resampled
    to 24 kHz, played first; a real Whisper hears the notice's words in the recording's agent channel."""
    config = AgentConfig.from_dict(
        {"recording": {"consent": "announce", "consent_text": NOTICE_WORDS,
                       "consent_tts_command": "espeak-ng -s 150 -w {out} {text}"}},
        base_dir=tmp_path,
    )  # fmt: skip
    notice = load_notice(config.recording)
    assert notice is not None and notice.dtype == np.float32
    assert 1.5 < notice.size / RATE < 6.0  # espeak-ng at 150 words a minute: about 3 s for 8 words
    assert wer(NOTICE_WORDS, await whisper_asr.transcribe(notice, RATE)) <= 0.15
    agent = Agent(config=config, engine=tiny_engine, seed=0, record_dir=tmp_path / "rec", router=False)
    frames = -(-notice.size // 1920)
    async with scripted_call(agent, call_id="CA-tts") as call:
        await _frames_written(call, frames + 2)
    pcm, rate = soundfile.read(tmp_path / "rec" / "CA-tts.wav", dtype="float32")
    heard_first = pcm[: notice.size, 1]
    assert np.max(np.abs(heard_first - notice)) < 1e-4  # the rendered notice, sample for sample (16-bit)
    assert wer(NOTICE_WORDS, await whisper_asr.transcribe(heard_first, rate)) <= 0.15


def test_a_failing_or_silent_tts_command_is_a_config_error_at_start(tmp_path):
    def notice_of(command: str):
        cfg = AgentConfig.from_dict(
            {"recording": {"consent": "ask", "consent_text": NOTICE_WORDS, "consent_tts_command": command}},
            base_dir=tmp_path,
        )  # fmt: skip
        return load_notice(cfg.recording)

    with pytest.raises(ConfigError, match="consent_tts_command failed"):
        notice_of(f"{sys.executable} -c 'import sys; sys.exit(3)' {{text}} {{out}}")
    with pytest.raises(ConfigError, match="consent_tts_command failed"):
        notice_of("no-such-tts-program-here -w {out} {text}")
    with pytest.raises(ConfigError, match="cannot read it as audio"):
        notice_of(f"{sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(\"not a wav\")' {{out}}")
