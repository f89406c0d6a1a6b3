"""Question capture: the caller's audio cut into utterances with Silero VAD, finished utterances transcribed,
and, on `<ret>`, the question picked the way `CaptureConfig` says.

On `<ret>` at stream time `t`:
  1. `final`: the caller is not speaking and an utterance ended within `final_window_s` (3 s) of `t`: its
     transcript (usually ready already: finals are transcribed as soon as they end);
  2. `wait`: the caller is speaking: wait up to `wait_s` (1 s) for the utterance to end, cutting it at
     `silence_s` (0.4 s) of silence instead of the usual `end_silence_s`;
  3. `window`: otherwise (or when the wait runs out) transcribe the last `fallback_window_s` (12 s) of audio;
     a window without any detected voice is not sent to ASR (empty question, so no span).

Input is mono float32 PCM at any rate (the pipeline feeds levelled 24 kHz frames of 1920 samples) with the
stream time of each chunk; audio is kept at 16 kHz, the rate of Silero and of most ASR models. VAD compute
runs on a worker thread, never on the event loop.

Example:
    >>> from duetaspan.adapters.asr import TranscribeClient   # any `duetaspan.router.ports.Transcriber`
    >>> capture = QuestionCapture(TranscribeClient("http://127.0.0.1:8990/transcribe"))
    >>> # await capture.feed(frame, 24000, t)      # every 80 ms
    >>> # question = await capture.question(t_ret)  # on <ret>: Question(text, how, asr_ms, ...)
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import soxr

from duetaspan.errors import AudioFormatError
from duetaspan.router.ports import Transcriber, TranscriptionError, Word, words_of

log = logging.getLogger(__name__)

RATE = 16_000


class VoiceDetector(Protocol):
    """Scores fixed windows of 16 kHz audio with a speech probability. Called from one worker thread."""

    window: int

    def confidence(self, window: np.ndarray) -> float: ...


class SileroVoiceDetector:
    """Silero VAD (the ONNX model bundled in Pipecat's wheel; no download), 512-sample windows at 16 kHz."""

    window = 512

    def __init__(self) -> None:
        from pipecat.audio.vad.silero import SileroVADAnalyzer

        self._analyzer = SileroVADAnalyzer(sample_rate=RATE)
        self._analyzer.set_sample_rate(RATE)

    def confidence(self, window: np.ndarray) -> float:
        ints = (np.clip(window, -1.0, 1.0) * 32767.0).astype("<i2")
        return float(np.asarray(self._analyzer.voice_confidence(ints.tobytes())).reshape(-1)[0])


@dataclass
class Utterance:
    """One stretch of caller speech (stream times in seconds); `text` is None until transcribed."""

    start: float
    end: float
    text: str | None = None
    asr_ms: float = 0.0
    error: str | None = None
    words: tuple[Word, ...] = ()  # word times in stream seconds, where the ASR gives them
    task: asyncio.Task | None = field(default=None, repr=False, compare=False)


@dataclass
class Question:
    """The question for one `<ret>`: its text (may be empty), how it was found and what it cost, and its word
    times in stream seconds where the ASR gives them (`duetaspan.router.ports.Transcript`)."""

    text: str
    how: Literal["final", "wait", "window"]
    asr_ms: float = 0.0
    wait_ms: float = 0.0
    audio_s: float = 0.0
    words: tuple[Word, ...] = ()


@dataclass
class _Settings:
    final_window_s: float = 3.0
    wait_s: float = 1.0
    silence_s: float = 0.4
    fallback_window_s: float = 12.0


class QuestionCapture:
    """Per-call utterance segmentation, transcription of finals, and question selection on `<ret>`.

    Args:
        asr: the transcription client.
        config: a `duetaspan.config.CaptureConfig` (final_window_s, wait_s, silence_s, fallback_window_s).
        on_utterance: called with each transcribed final `Utterance` (e.g. `ContextDB.add_utterance`).
        on_speech: called with `("started", t)` when voice starts an utterance and `("stopped", t)` when it
            ends (`t`: stream time of the utterance's start / end), e.g. to emit turn frames.
        vad: the voice detector (default: Silero).
        threshold: speech probability that counts as voice.
        start_s: voice needed to start an utterance; end_silence_s: silence that ends one normally.
        max_utterance_s: an utterance is cut (and transcribed) after this long.
        preroll_s: audio kept before the detected start (onsets score low).
    """

    def __init__(
        self,
        asr: Transcriber,
        config: Any = None,
        *,
        on_utterance: Callable[[Utterance], Any] | None = None,
        on_speech: Callable[[str, float], Any] | None = None,
        vad: VoiceDetector | None = None,
        threshold: float = 0.5,
        start_s: float = 0.15,
        end_silence_s: float = 0.7,
        max_utterance_s: float = 20.0,
        preroll_s: float = 0.2,
    ) -> None:
        base = _Settings()
        self.settings = _Settings(
            **{k: float(getattr(config, k, getattr(base, k))) for k in vars(base)}
            if config is not None
            else {}
        )
        self.asr = asr
        self.on_utterance = on_utterance
        self.on_speech = on_speech
        self.vad = vad if vad is not None else SileroVoiceDetector()
        self.threshold = threshold
        self.start_s = start_s
        self.end_silence_s = end_silence_s
        self.max_utterance_s = max_utterance_s
        self.preroll_s = preroll_s
        keep_s = max(self.settings.fallback_window_s, max_utterance_s) + 5.0
        self._ring = np.zeros(int(keep_s * RATE), dtype=np.float32)
        self._written = 0  # samples ever written (16 kHz)
        self._scored = 0  # samples ever scored by the VAD
        self._t0: float | None = None
        self._resampler: soxr.ResampleStream | None = None
        self._in_rate: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="duetaspan-vad")
        self._scoring = False  # a feed is scoring windows on the VAD thread
        self._voiced_run = 0
        self._silent_run = 0
        self._speech_start: int | None = None  # sample index, while speaking
        self._last_voice_end: int | None = None
        self._cut_waiters = 0
        self._ended = asyncio.Event()
        self._progress = asyncio.Event()  # set whenever the VAD has scored more of the audio
        self.utterances: deque[Utterance] = deque(maxlen=32)
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # -- time ------------------------------------------------------------------------------------------
    @property
    def now(self) -> float:
        """Stream time at the end of the audio fed so far."""
        return (self._t0 or 0.0) + self._written / RATE

    @property
    def speaking(self) -> bool:
        return self._speech_start is not None

    def _time(self, index: int) -> float:
        return (self._t0 or 0.0) + index / RATE

    def _index(self, t: float) -> int:
        return round((t - (self._t0 or 0.0)) * RATE)

    # -- audio in --------------------------------------------------------------------------------------
    async def feed(self, pcm: np.ndarray, sample_rate: int, t: float | None = None) -> None:
        """Add a chunk of caller audio (mono float32 at `sample_rate`) starting at stream time `t`."""
        if self._closed:
            return
        array = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if array.size == 0:
            return
        if self._t0 is None:
            self._t0 = float(t) if t is not None else 0.0
        if self._in_rate != sample_rate:
            if sample_rate <= 0:
                raise AudioFormatError(f"capture: sample_rate must be positive, got {sample_rate}")
            self._in_rate = sample_rate
            self._resampler = (
                None if sample_rate == RATE else soxr.ResampleStream(sample_rate, RATE, 1, "float32")
            )
        if self._resampler is not None:
            array = self._resampler.resample_chunk(array)
        self._write(array)
        if self._scoring:
            # one scorer at a time, and it catches up on everything written meanwhile in one batch: under
            # overload feeds must not queue up one task (and one VAD round trip) per chunk without bound
            return
        self._scoring = True
        try:
            loop = asyncio.get_running_loop()
            window = self.vad.window
            while not self._closed:  # closed: the VAD thread is gone
                oldest = max(0, self._written - len(self._ring))
                if self._scored < oldest:  # fell a whole ring behind: that audio is gone, go on from here
                    self._scored = -(-oldest // window) * window
                n_windows = (self._written - self._scored) // window
                if n_windows <= 0:
                    return
                windows = self._read(self._scored, n_windows * window).reshape(n_windows, window)
                scores = await loop.run_in_executor(self._executor, self._score, windows)
                for score in scores:
                    self._scored += window
                    self._step(score >= self.threshold)
                self._progress.set()
        finally:
            self._scoring = False

    def _score(self, windows: np.ndarray) -> list[float]:
        return [self.vad.confidence(w) for w in windows]

    def _write(self, array: np.ndarray) -> None:
        size = len(self._ring)
        if len(array) >= size:
            array = array[-size:]
        start = self._written % size
        first = min(len(array), size - start)
        self._ring[start : start + first] = array[:first]
        self._ring[: len(array) - first] = array[first:]
        self._written += len(array)

    def _read(self, index: int, count: int) -> np.ndarray:
        """`count` samples starting at absolute sample `index` (clamped to what the ring still holds)."""
        oldest = max(0, self._written - len(self._ring))
        index = max(index, oldest)
        count = max(0, min(count, self._written - index))
        size = len(self._ring)
        start = index % size
        if start + count <= size:
            return self._ring[start : start + count].copy()
        return np.concatenate([self._ring[start:], self._ring[: count - (size - start)]])

    # -- segmentation ----------------------------------------------------------------------------------
    def _step(self, voiced: bool) -> None:
        window_s = self.vad.window / RATE
        end_index = self._scored
        if voiced:
            self._voiced_run += 1
            self._silent_run = 0
            self._last_voice_end = end_index
            if self._speech_start is None and self._voiced_run * window_s >= self.start_s:
                onset = end_index - self._voiced_run * self.vad.window
                self._speech_start = max(0, onset - int(self.preroll_s * RATE))
                if self.on_speech is not None:
                    self.on_speech("started", self._time(onset))
        else:
            self._voiced_run = 0
            self._silent_run += 1
        if self._speech_start is None:
            return
        limit = self.settings.silence_s if self._cut_waiters else self.end_silence_s
        too_long = (end_index - self._speech_start) / RATE >= self.max_utterance_s
        if self._silent_run * window_s >= limit or too_long:
            stop = (self._last_voice_end or end_index) + int(0.1 * RATE)
            self._finish(self._speech_start, min(stop, end_index))

    def _finish(self, start: int, stop: int) -> None:
        self._speech_start = None
        self._voiced_run = 0
        utterance = Utterance(self._time(start), self._time(stop))
        if self.on_speech is not None:
            self.on_speech("stopped", utterance.end)
        audio = self._read(start, stop - start)
        utterance.task = self._spawn(self._transcribe_final(utterance, audio))
        self.utterances.append(utterance)
        self._ended.set()
        self._ended = asyncio.Event()

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _transcribe_final(self, utterance: Utterance, audio: np.ndarray) -> None:
        start = time.perf_counter()
        try:
            text = await self.asr.transcribe(audio, RATE)
        except (TranscriptionError, AudioFormatError) as exc:
            utterance.error = str(exc)
            utterance.text = None
            log.warning("capture: ASR of a final utterance failed: %s", exc)
            return
        finally:
            utterance.asr_ms = (time.perf_counter() - start) * 1000.0
        utterance.text = str(text)
        utterance.words = words_of(text, utterance.start)
        if text and self.on_utterance is not None:
            result = self.on_utterance(utterance)
            if inspect.isawaitable(result):
                await result

    # -- questions -------------------------------------------------------------------------------------
    async def question(self, t: float | None = None) -> Question:
        """The question for a `<ret>` at stream time `t` (default: now); `TranscriptionError` if ASR fails."""
        t = self.now if t is None else t
        started = time.perf_counter()
        await self._catch_up(t)
        if not self.speaking:
            recent = self._recent_final(t)
            if recent is not None:
                text = await self._text_of(recent)
                if text is not None:
                    audio_s = recent.end - recent.start
                    return Question(text, "final", recent.asr_ms, _ms(started), audio_s, recent.words)
        else:
            ended = await self._wait_for_end()
            if ended is not None:
                text = await self._text_of(ended)
                if text is not None:
                    audio_s = ended.end - ended.start
                    return Question(text, "wait", ended.asr_ms, _ms(started), audio_s, ended.words)
        return await self._window_question(started)

    async def _catch_up(self, t: float) -> None:
        """Let the voice detection reach the audio written up to `t` (at most `wait_s`): feeds score on the VAD
        thread while newer audio is written, and on a loaded machine they run behind the line. Judged on an older
        state, a `<ret>` right after the caller's latest words, not yet seen starting, took the utterance before
        them (it ended within `final_window_s`) for the question."""
        target = min(self._written, self._index(t)) - self.vad.window
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.wait_s
        while self._scored < target and self._scoring and not self._closed:
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                behind = (target - self._scored) / RATE
                log.warning("capture: at <ret> the voice detection is still %.2f s behind the line", behind)
                return

    def _recent_final(self, t: float) -> Utterance | None:
        for utterance in reversed(self.utterances):
            if utterance.end <= t + 0.5 and utterance.end >= t - self.settings.final_window_s:
                return utterance
        return None

    async def _text_of(self, utterance: Utterance) -> str | None:
        if utterance.task is not None and not utterance.task.done():
            await asyncio.shield(utterance.task)
        return utterance.text

    async def _wait_for_end(self) -> Utterance | None:
        self._cut_waiters += 1
        event = self._ended
        try:
            await asyncio.wait_for(event.wait(), self.settings.wait_s)
        except TimeoutError:
            return None
        finally:
            self._cut_waiters -= 1
        return self.utterances[-1] if self.utterances else None

    async def _window_question(self, started: float) -> Question:
        count = int(self.settings.fallback_window_s * RATE)
        first = max(0, self._written - count)
        audio_s = (self._written - first) / RATE
        if self._last_voice_end is None or self._last_voice_end <= first or audio_s < 0.1:
            return Question("", "window", 0.0, _ms(started), audio_s)
        audio = self._read(first, self._written - first)
        asr_start = time.perf_counter()
        text = await self.asr.transcribe(audio, RATE)
        words = words_of(text, self._time(first))
        return Question(str(text), "window", _ms(asr_start), _ms(started), audio_s, words)

    async def aclose(self) -> None:
        """Stop: cancel pending transcriptions and release the VAD thread."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._executor.shutdown(wait=False, cancel_futures=True)


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000.0
