"""Audio mode (`duetaspan eval`, the default): each scenario is a call on the full agent. The caller's audio
(the scenario's wav files, or its text rendered by a TTS command) is played into an in-process transport at
the engine clock's pace, so capture, ASR, router, tools, spans and the duplex model run with exactly the
timing of a live call; the agent's words come from its text stream, its tool calls from the registry.

Scenarios run `jobs` at a time, one engine slot each: the engine steps all of them in one batched step per
80 ms frame, which is how a run goes faster than real time. With `force_ret` the harness forces `<ret>`
after each routed turn (and chained ones while tools keep running) and the model never asks by itself: for
models that do not ask, like `tiny-random`, where this tests the harness rather than the model.

Example:
    >>> async def main(config, suite):                              # doctest: +SKIP
    ...     async with AudioRunner(config, suite, jobs=4) as runner:
    ...         run = await runner.run(suite.scenarios[0])
    ...     print([c.tool for c in run.calls], run.answer)
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import tempfile
import time
import uuid
import wave
from pathlib import Path
from typing import Any

import numpy as np
from pipecat.frames.frames import Frame, InputAudioRawFrame, TTSTextFrame

from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError, DuetaspanError
from duetaspan.eval.fdb_export import asr_chunks, speech_end_s
from duetaspan.eval.result import ScenarioRun
from duetaspan.eval.scenario import Scenario, Suite
from duetaspan.eval.tools import CallLog, mock_tools
from duetaspan.model.convention import FRAME_MS, SAMPLE_RATE
from duetaspan.pipeline.frames import LateSpanFrame, NoSpanFrame, RetrievalEventFrame, SpanFrame
from duetaspan.pipeline.resample import float_to_int16_bytes
from duetaspan.pipeline.session import CallInfo, CallSession
from duetaspan.testing.loopback import LoopbackOutput, LoopbackTransport

CHUNK_MS = 20
ASK_AFTER_S = 0.7  # silence after a turn before a forced <ret>: the VAD's end-of-utterance wait


class CallerAudioError(DuetaspanError):
    """A scenario's caller audio could not be read or rendered (missing wav, failing TTS command)."""


class _Output(LoopbackOutput):
    """The call's far end: keeps the agent's words (with arrival times) and the retrieval outcomes."""

    def __init__(self) -> None:
        super().__init__()
        self.words: list[tuple[float, str]] = []
        self.events: list[dict[str, Any]] = []
        self.outcomes: asyncio.Queue[Frame] = asyncio.Queue()

    def keep(self, frame: Frame) -> None:
        if isinstance(frame, TTSTextFrame):
            self.words.append((time.monotonic(), frame.text))
        elif isinstance(frame, SpanFrame | NoSpanFrame | LateSpanFrame):
            self.outcomes.put_nowait(frame)
        elif isinstance(frame, RetrievalEventFrame):
            self.events.append(frame.event)
            if frame.event.get("kind") == "error":  # a failed retrieval ends without a span frame
                self.outcomes.put_nowait(frame)


class EvalTransport(LoopbackTransport):
    """An in-process transport: the runner queues caller audio; the output side (`far_end`) listens."""

    far_end: _Output

    def __init__(self) -> None:
        super().__init__(_Output())


def read_wav(path: Path) -> np.ndarray:
    """A wav file as 24 kHz float32 mono."""
    try:
        with wave.open(str(path), "rb") as w:
            if w.getsampwidth() != 2:
                raise CallerAudioError(f"{path}: expected 16-bit PCM, got {8 * w.getsampwidth()}-bit")
            rate, channels = w.getframerate(), w.getnchannels()
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
    except (OSError, EOFError, wave.Error) as exc:
        raise CallerAudioError(f"{path}: cannot read the caller audio ({exc})") from None
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1)
    if rate != SAMPLE_RATE:
        import soxr

        pcm = soxr.resample(pcm, rate, SAMPLE_RATE).astype(np.float32)
    return pcm


class AudioRunner:
    """Plays scenarios into the full agent (see the module docstring).

    Args:
        config: the agent's configuration (model, router, ASR, tools, persona...).
        suite: the scenarios; its mock tools, when it declares any, are the agent's only tools.
        jobs: calls at once (engine slots).
        tts_command: renders a turn without audio: `{text}` and `{out}` (wav path) are substituted.
        gap_s / tail_s: silence after each caller turn / after the last one.
        force_ret: force `<ret>` after routed turns; the model's own `<ret>` is then off.
        engine: an already-loaded engine (tests); otherwise the config's model is loaded.
    """

    def __init__(
        self,
        config: AgentConfig,
        suite: Suite,
        *,
        jobs: int = 1,
        tts_command: str | None = None,
        gap_s: float = 2.0,
        tail_s: float = 3.0,
        force_ret: bool = False,
        max_chain: int = 4,
        timeout_s: float = 120.0,
        engine: Any = None,
        seed: int = 0,
    ) -> None:
        self.config, self.suite = config, suite
        self.jobs, self.tts_command = jobs, tts_command
        self.gap_s, self.tail_s = gap_s, tail_s
        self.force_ret, self.max_chain, self.timeout_s = force_ret, max_chain, timeout_s
        self.engine, self.seed = engine, seed
        self.agent: Any = None
        self.log: CallLog | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    def check_audio(self) -> None:
        """Every routed scenario has recordings or a TTS command to render its turns."""
        for s in self.suite.scenarios:
            paths = (
                [self.suite.resolve(s.audio)] if s.audio else [self.suite.resolve(t.audio) for t in s.turns]
            )
            for i, path in enumerate(paths):
                if path is None and not self.tts_command:
                    raise ConfigError(
                        f"scenario {s.id!r} turn {i + 1} has no audio: add `audio:` to the file, pass "
                        "--tts-command (or --audio-dir for FDB-v3), or run with --text"
                    )
                if path is not None and not path.is_file():
                    raise ConfigError(f"scenario {s.id!r}: audio file {path} not found")

    async def start(self) -> None:
        from duetaspan.agent import Agent
        from duetaspan.model.engine import SamplingParams

        cfg = self.config.model_copy(deep=True)
        cfg.base_dir = self.config.base_dir
        tools: list[Any] = []
        if self.suite.tools:  # the file's mock tools are the agent's only tools
            cfg.tools.builtins, cfg.tools.modules, cfg.mcp_servers = [], [], []
            tools = mock_tools(self.suite.tools, fdb_v3=self.suite.format == "fdb-v3")
        self.agent = Agent(
            config=cfg,
            tools=tools,
            engine=self.engine,
            max_calls=self.jobs,
            seed=self.seed,
            sampling=SamplingParams(allow_ret=False) if self.force_ret else None,
        )
        await self.agent.start()
        self.log = CallLog.wrap(self.agent.registry)

    async def close(self) -> None:
        if self.agent is not None:
            await self.agent.stop()
            self.agent = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def __aenter__(self) -> AudioRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # caller audio ---------------------------------------------------------------------------------------
    async def _render(self, text: str) -> np.ndarray:
        assert self.tts_command
        if self._tmp is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="duetaspan-eval-")
        out = Path(self._tmp.name) / f"tts-{uuid.uuid4().hex[:12]}.wav"
        argv = [a.replace("{text}", text).replace("{out}", str(out)) for a in shlex.split(self.tts_command)]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
        except OSError as exc:
            raise CallerAudioError(f"--tts-command {argv[0]!r} could not start: {exc}") from None
        _, err = await proc.communicate()
        if proc.returncode != 0 or not out.is_file():
            tail = err.decode(errors="replace").strip()[-300:]
            raise CallerAudioError(f"--tts-command failed (exit {proc.returncode}) for {text!r}: {tail}")
        return read_wav(out)

    async def segments(self, scenario: Scenario) -> list[tuple[np.ndarray, bool]]:
        """The caller's audio, per turn (or one recording for the whole scenario), and whether it is routed."""
        if scenario.audio is not None:
            path = self.suite.resolve(scenario.audio)
            assert path is not None
            return [(read_wav(path), True)]
        out = []
        for turn in scenario.turns:
            path = self.suite.resolve(turn.audio)
            pcm = read_wav(path) if path is not None else await self._render(turn.text)
            out.append((pcm, turn.route))
        return out

    # one call ---------------------------------------------------------------------------------------------
    async def run(self, scenario: Scenario) -> ScenarioRun:
        """Play one scenario as a call; retrieval failures and timeouts are recorded, never raised."""
        assert self.agent is not None and self.log is not None, "start() the runner first"
        segments = await self.segments(scenario)
        call_id = f"eval-{scenario.id}-{uuid.uuid4().hex[:8]}"
        transport = EvalTransport()
        session = self.agent.create_session(CallInfo(call_id, transport="eval"), transport)
        run = ScenarioRun(scenario.id)
        self.log.start(call_id)
        started = time.monotonic()
        played: list[tuple[float, float, bool]] = []  # each segment's (start, end, routed), monotonic

        async def drive() -> None:
            try:
                await asyncio.wait_for(session.service.started.wait(), self.timeout_s)
                for pcm, routed in segments:
                    start = time.monotonic()
                    await self._play(session, pcm)
                    played.append((start, time.monotonic(), routed))
                    gap = self.gap_s
                    if self.force_ret and routed:
                        # as the model would: once the caller has stopped (VAD closes the utterance)
                        settle = min(gap, ASK_AFTER_S)
                        await self._play(session, np.zeros(int(SAMPLE_RATE * settle), np.float32))
                        gap -= settle
                        await self._ask(session, transport.far_end, call_id)
                    await self._play(session, np.zeros(int(SAMPLE_RATE * gap), np.float32))
                await self._play(session, np.zeros(int(SAMPLE_RATE * self.tail_s), np.float32))
            finally:
                await session.end()

        caller = asyncio.ensure_future(drive())
        try:
            async with asyncio.timeout(self.timeout_s):
                await session.run()  # returns when the caller side ends the call (or the call fails)
                await caller
        except TimeoutError:
            run.error = f"timed out after {self.timeout_s:g} s"
        finally:
            if not caller.done():  # the call ended or failed first: stop playing into it
                caller.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await caller
        run.elapsed_s = time.monotonic() - started
        far = transport.far_end
        run.answer_parts = ["".join(text for _, text in far.words)]
        run.trace = list(far.events)
        failed = next((e for e in far.events if e.get("kind") == "error"), None)
        if failed is not None and run.error is None:
            run.error = f"retrieval failed at {failed.get('stage')}: {failed.get('error')}"
        # times from the stream start (the caller's first frame); calls, words and speech share that origin
        origin = played[0][0] if played else started
        run.calls = self.log.calls(call_id, since=origin)
        routed = [i for i, (_, _, r) in enumerate(played) if r] or list(range(len(played)))
        speech_start, speech_end = (
            (played[routed[-1]][0], played[routed[-1]][1]) if routed else (origin, origin)
        )
        # call time from the end of the last caller turn; negative: the agent called before the caller finished
        last_turn = [c.t for c in run.calls if c.t >= speech_start - origin]
        if last_turn:
            run.latency_s = last_turn[0] - (speech_end - origin)
        after = [t for t, text in far.words if t >= speech_end and text.strip()]
        run.response_latency_s = after[0] - speech_end if after else None
        if routed:
            run.stream = self._stream_fields(
                segments[routed[-1]][0], speech_start - origin, far.words, origin
            )
        return run

    @staticmethod
    def _stream_fields(
        pcm: np.ndarray, start_s: float, words: list[tuple[float, str]], origin: float
    ) -> dict[str, Any]:
        """FDB-v3's timing fields (seconds from the stream start): the end of the routed caller speech (the
        benchmark's rule on the audio's voiced frames), the agent's first word from that turn on, its words."""
        end = speech_end_s(pcm, SAMPLE_RATE)
        spoken = [(t - origin, text) for t, text in words]
        first = next((t for t, text in spoken if text.strip() and t >= start_s), None)
        return {
            "asr_chunks": asr_chunks(spoken, frame_s=FRAME_MS / 1000),
            "user_speech_end_rel": None if end is None else round(start_s + end, 3),
            "audio_agent_speech_start": None if first is None else round(first, 3),
        }

    async def _play(self, session: CallSession, pcm: np.ndarray) -> None:
        """Queue 24 kHz audio in 20 ms frames on absolute deadlines (the engine clock's real-time pace)."""
        worker = session.worker
        if worker is None:
            return
        n = SAMPLE_RATE * CHUNK_MS // 1000
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        for i in range(0, pcm.size, n):
            chunk = pcm[i : i + n]
            if chunk.size < n:
                chunk = np.pad(chunk, (0, n - chunk.size))
            await worker.queue_frame(InputAudioRawFrame(float_to_int16_bytes(chunk), SAMPLE_RATE, 1))
            await asyncio.sleep(max(0.0, t0 + (i // n + 1) * CHUNK_MS / 1000 - loop.time()))

    async def _ask(self, session: CallSession, far: _Output, call_id: str) -> None:
        """Force `<ret>` and wait for its outcome; ask again while each retrieval ran a new tool call."""
        assert self.log is not None
        slot = session.service.slot
        if slot is None:
            return
        deadline = self.agent.config.retrieval.deadline_s + 10.0
        for _ in range(self.max_chain):
            before = len(self.log.calls(call_id))
            slot.force_ret()
            with contextlib.suppress(TimeoutError):
                outcome = await asyncio.wait_for(far.outcomes.get(), deadline)
                if isinstance(outcome, SpanFrame) and outcome.tool and len(self.log.calls(call_id)) > before:
                    continue
            return
