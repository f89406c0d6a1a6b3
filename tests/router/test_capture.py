"""Question capture with the real Silero VAD over the shared fixture recordings."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from duetaspan.config import CaptureConfig
from duetaspan.router import QuestionCapture, SileroVoiceDetector
from tests.support import fixture_phrase, load_wav


class RecordingASR:
    """An in-process ASR that answers with the phrase and records each clip's length."""

    def __init__(self, text: str, delay_s: float = 0.0):
        self.text = text
        self.delay_s = delay_s
        self.clips: list[float] = []

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        self.clips.append(len(pcm) / sample_rate)
        await asyncio.sleep(self.delay_s)
        return self.text


async def feed(capture: QuestionCapture, audio: np.ndarray, rate: int, t0: float = 0.0) -> float:
    for i in range(0, len(audio) - 1919, 1920):
        await capture.feed(audio[i : i + 1920], rate, t0 + i / rate)
    return t0 + (len(audio) // 1920) * 1920 / rate


def test_silero_loads_offline_from_the_pipecat_wheel():
    vad = SileroVoiceDetector()
    _, rate = load_wav("time_tokyo")
    assert rate == 24000
    assert vad.confidence(np.zeros(512, dtype=np.float32)) < 0.1


@pytest.mark.parametrize("name", ["weather_sydney", "book_table", "self_correction"])
async def test_final_utterance_is_the_question(name):
    pcm, rate = load_wav(name)
    asr = RecordingASR(fixture_phrase(name))
    finals = []
    capture = QuestionCapture(asr, CaptureConfig(), on_utterance=finals.append)
    silence = np.zeros(rate, dtype=np.float32)
    t = await feed(capture, np.concatenate([silence, pcm, silence]), rate)
    question = await capture.question(t)
    await capture.aclose()
    assert question.how == "final" and question.text == fixture_phrase(name)
    assert len(finals) == 1 and len(asr.clips) == 1  # no second ASR call at <ret>
    speech_s = len(pcm) / rate
    assert speech_s - 1.6 < question.audio_s < speech_s + 0.3
    assert 0.9 < finals[0].start < 2.0


async def test_wait_for_the_utterance_in_progress_and_cut_early():
    pcm, rate = load_wav("time_tokyo")
    asr = RecordingASR("What time is it in Tokyo at the moment?")
    capture = QuestionCapture(asr, CaptureConfig(wait_s=1.0, silence_s=0.4))
    silence = np.zeros(rate, dtype=np.float32)
    t = await feed(capture, np.concatenate([silence, pcm[: len(pcm) - rate]]), rate)
    assert capture.speaking

    async def rest_in_real_time():
        nonlocal t
        rest = np.concatenate([pcm[len(pcm) - rate :], silence])
        for i in range(0, len(rest) - 1919, 1920):
            await capture.feed(rest[i : i + 1920], rate, t)
            t += 0.08
            await asyncio.sleep(0.01)

    feeder = asyncio.create_task(rest_in_real_time())
    question = await capture.question(t)
    await feeder
    await capture.aclose()
    assert question.how == "wait" and question.text.startswith("What time")
    assert question.wait_ms < 1000


async def test_window_fallback_when_the_wait_runs_out():
    pcm, rate = load_wav("order_status")
    asr = RecordingASR("where is my order", delay_s=0.0)
    capture = QuestionCapture(asr, CaptureConfig(wait_s=0.2, fallback_window_s=12.0))
    t = await feed(capture, pcm[: len(pcm) - rate // 2], rate)  # still speaking, no more audio comes
    question = await capture.question(t)
    await capture.aclose()
    assert question.how == "window" and question.text == "where is my order"
    assert question.audio_s == pytest.approx(t, abs=0.1) and asr.clips[-1] == pytest.approx(t, abs=0.1)


async def test_window_is_bounded_and_silence_is_not_transcribed():
    pcm, rate = load_wav("greeting")
    asr = RecordingASR("hello")
    capture = QuestionCapture(asr, CaptureConfig(fallback_window_s=2.0))
    silence = np.zeros(rate * 3, dtype=np.float32)
    t = await feed(capture, silence, rate)
    question = await capture.question(t)
    assert question.how == "window" and question.text == "" and asr.clips == []
    # an old final (more than final_window_s ago) is not the question: the window is, capped at 2 s
    t = await feed(capture, np.concatenate([pcm, np.zeros(rate * 5, dtype=np.float32)]), rate, t)
    asr.clips.clear()
    question = await capture.question(t)
    assert question.how == "window" and question.text == ""  # the last 2 s are silent
    await capture.aclose()


async def test_any_input_rate_is_resampled():
    pcm, rate = load_wav("weather_sydney")
    import soxr

    pcm8 = soxr.resample(pcm, rate, 8000).astype(np.float32)
    asr = RecordingASR("weather")
    capture = QuestionCapture(asr)
    audio = np.concatenate([np.zeros(8000, dtype=np.float32), pcm8, np.zeros(8000, dtype=np.float32)])
    for i in range(0, len(audio) - 159, 160):  # 20 ms Twilio-sized chunks
        await capture.feed(audio[i : i + 160], 8000, i / 8000)
    question = await capture.question()
    await capture.aclose()
    assert question.how == "final" and len(asr.clips) == 1


class SlowVoiceDetector:
    """Silero on a loaded machine: every window takes `delay_s` more on the VAD thread."""

    window = 512

    def __init__(self, delay_s: float) -> None:
        self.vad, self.delay_s = SileroVoiceDetector(), delay_s

    def confidence(self, window: np.ndarray) -> float:
        time.sleep(self.delay_s)
        return self.vad.confidence(window)


class NumberedASR:
    """Answers its n-th transcription with `texts[n]`."""

    def __init__(self, *texts: str) -> None:
        self.texts, self.clips = list(texts), []

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        self.clips.append(len(pcm) / sample_rate)
        return self.texts[min(len(self.clips), len(self.texts)) - 1]


async def test_a_ret_right_after_new_words_is_judged_once_the_voice_detection_reached_them():
    """The service spawns a feed per frame; while one scores on the VAD thread the next ones only write, so on a
    loaded machine the detection runs behind the line. A `<ret>` then saw no speech yet and took the caller's
    previous utterance, ended within `final_window_s`, for the question (the reminder example's flake)."""
    first, rate = load_wav("weather_sydney")
    second = load_wav("book_table")[0][: rate]  # its first second
    asr = NumberedASR("the first question", "the second question")
    capture = QuestionCapture(asr, CaptureConfig(final_window_s=6.0), vad=SlowVoiceDetector(0.002))
    silence = np.zeros(rate, dtype=np.float32)
    t = await feed(capture, np.concatenate([silence, first, silence]), rate)
    assert [u.text for u in capture.utterances] == ["the first question"] and not capture.speaking
    rest = np.concatenate([second, silence, silence[: rate // 2]])
    feeds = [asyncio.create_task(capture.feed(rest[i : i + 1920], rate, t + i / rate))
             for i in range(0, len(rest) - 1919, 1920)]  # fmt: skip
    await asyncio.sleep(0)  # every frame written; the first feed scores, the rest wait their turn
    question = await capture.question(t + (len(rest) // 1920) * 1920 / rate)
    await asyncio.gather(*feeds)
    await capture.aclose()
    assert question.text == "the second question" and question.how == "final", question
