"""The page's event stream: what `AgentEvents` and `CallerEvents` turn pipeline frames into, in a real Pipecat
pipeline (`pipecat.tests.utils.run_test`)."""

from __future__ import annotations

import numpy as np
from pipecat.frames.frames import (
    InputAudioRawFrame,
    OutputTransportMessageFrame,
    OutputTransportMessageUrgentFrame,
    SpeechOutputAudioRawFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.tests.utils import run_test
from pipecat.utils.text.base_text_aggregator import TextType

from duetaspan.adapters.webrtc.events import (
    SILENCE_DBFS,
    AgentEvents,
    CallerEvents,
    PageCommand,
    SpanEvent,
    audio_dbfs,
)
from duetaspan.pipeline.frames import AgentBargedInFrame, NoSpanFrame, RetFrame, SpanFrame
from duetaspan.pipeline.resample import float_to_int16_bytes
from tests.support import load_wav


def _tone(seconds: float, amplitude: float, rate: int = 24000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return float_to_int16_bytes((amplitude * np.sin(2 * np.pi * 220 * t)).astype(np.float32))


def test_levels():
    assert audio_dbfs(bytes(3840)) == SILENCE_DBFS
    assert abs(audio_dbfs(_tone(0.08, 0.5)) - (20 * np.log10(0.5 / np.sqrt(2)))) < 0.1
    pcm, _ = load_wav("greeting")
    assert -45 < audio_dbfs(float_to_int16_bytes(pcm)) < -5


async def test_agent_events_follow_their_frames_in_order():
    agent = AgentEvents()
    span = SpanFrame(
        reference="(tool result) It is 3 PM in Tokyo.",
        frame_index=40,
        t=3.2,
        n_frames=14,
        prefill_ms=5.123,
        question="What time is it in Tokyo?",
        tool="get_time",
        arguments={"place": "Tokyo"},
        latency_ms=812.4,
    )
    word = TTSTextFrame(text=" Hello", text_type=TextType.WORD)
    frames = [
        SpeechOutputAudioRawFrame(audio=_tone(0.08, 0.3), sample_rate=24000, num_channels=1),
        word,
        RetFrame(frame_index=38, t=3.04),
        span,
        NoSpanFrame(question="?", reason="no tool fits", t=4.0),
    ]
    down, _ = await run_test(
        agent,
        frames_to_send=frames,
        expected_down_frames=[
            SpeechOutputAudioRawFrame,
            TTSTextFrame,
            OutputTransportMessageFrame,
            RetFrame,
            OutputTransportMessageFrame,
            SpanFrame,
            OutputTransportMessageFrame,
            NoSpanFrame,
            OutputTransportMessageFrame,
        ],
    )
    messages = [
        f.message
        for f in down
        if isinstance(f, OutputTransportMessageFrame | OutputTransportMessageUrgentFrame)
    ]
    assert all(m["label"] == "duetaspan" for m in messages)
    by_type = {m["type"]: m for m in messages}
    assert by_type["agent_text"] == {"label": "duetaspan", "type": "agent_text", "text": " Hello"}
    assert by_type["ret"]["frame_index"] == 38 and by_type["ret"]["t"] == 3.04
    assert by_type["span"] == SpanEvent(
        reference=span.reference,
        tool="get_time",
        arguments={"place": "Tokyo"},
        question=span.question,
        latency_ms=812.4,
        n_frames=14,
        prefill_ms=5.12,
        t=3.2,
    ).model_dump(mode="json", exclude_none=True)
    assert by_type["no_span"]["reason"] == "no tool fits"
    assert agent.meter.frames == 1 and abs(agent.meter.seconds - 0.08) < 1e-9


async def test_barge_in_is_urgent():
    down, _ = await run_test(
        AgentEvents(),
        frames_to_send=[AgentBargedInFrame(frame_index=60, t=4.8, spoke_frames=9)],
        expected_down_frames=[AgentBargedInFrame, OutputTransportMessageUrgentFrame],
    )
    assert down[1].message == {"label": "duetaspan", "type": "barge_in", "t": 4.8}


async def test_caller_events_turn_upstream_utterances_into_page_messages():
    caller = CallerEvents(AgentEvents(), stats_interval_s=60)
    utterance = TranscriptionFrame(text="What time is it in Tokyo?", user_id="web-1", timestamp="1.0")
    down, _ = await run_test(
        caller,
        frames_to_send=[utterance],
        frames_to_send_direction=FrameDirection.UPSTREAM,
        expected_down_frames=[OutputTransportMessageUrgentFrame],
        expected_up_frames=[TranscriptionFrame],
    )
    assert down[0].message == {
        "label": "duetaspan",
        "type": "caller_text",
        "text": "What time is it in Tokyo?",
    }


async def test_caller_stats_count_sound_not_silence():
    agent = AgentEvents()
    caller = CallerEvents(agent, stats_interval_s=60)
    frames = [
        InputAudioRawFrame(audio=bytes(960), sample_rate=24000, num_channels=1) for _ in range(50)
    ]  # 1 s
    frames += [
        InputAudioRawFrame(audio=_tone(0.02, 0.2), sample_rate=24000, num_channels=1) for _ in range(25)
    ]
    await run_test(caller, frames_to_send=frames, expected_down_frames=[InputAudioRawFrame] * 75)
    stats = caller.stats()
    assert stats.caller_frames == 75
    assert abs(stats.caller_seconds - 1.5) < 1e-6 and abs(stats.caller_sound_seconds - 0.5) < 1e-6
    assert -20 < stats.caller_dbfs < -16  # a 0.2 sine: -17 dBFS
    assert caller.stats().caller_dbfs == SILENCE_DBFS  # the peak is per stats message
    assert stats.agent_seconds == 0.0


def test_page_commands():
    assert (
        PageCommand.model_validate({"label": "duetaspan", "type": "force_ret", "extra": 1}).type
        == "force_ret"
    )
