"""The agent's side of a call as Pipecat frames: turns of agent speech, their words, and barge-in.

The duplex model never announces a "response": it emits one frame every 80 ms, speaking or silent, with a
text piece now and then. `AgentTurns` cuts that stream into turns the way Pipecat's speech-to-speech
services (OpenAI Live, OpenAI Realtime, Gemini Live) bracket theirs, so `LLMContextAggregatorPair`, RTVI and
observers work unchanged:

    LLMFullResponseStartFrame, TTSStartedFrame      first speaking frame (or word) after silence
    LLMTextFrame (append_to_context=False)          per word piece (RTVI's "bot-llm-text")
    TTSTextFrame (includes_inter_frame_spaces)      per word piece (what the assistant aggregator records)
    TTSStoppedFrame, LLMFullResponseEndFrame        after `end_silence_frames` silent frames, or at once on
                                                    barge-in / the end of the call

`BargeIn` spots the model stopping for the caller: an agent run of speech that turns silent while the
caller's audio is loud.

Example:
    >>> turns = AgentTurns(end_silence_frames=2)
    >>> [type(f).__name__ for f in turns.step(silent=False, text=" hi")]
    ['LLMFullResponseStartFrame', 'TTSStartedFrame', 'LLMTextFrame', 'TTSTextFrame']
    >>> turns.step(silent=True, text=""), [type(f).__name__ for f in turns.step(silent=True, text="")]
    ([], ['TTSStoppedFrame', 'LLMFullResponseEndFrame'])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pipecat.frames.frames import (
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    SpeechOutputAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.utils.text.base_text_aggregator import TextType
from pydantic import BaseModel, Field

from duetaspan.model.convention import FRAME_SIZE, SAMPLE_RATE
from duetaspan.pipeline.resample import Quality, StreamResampler, float_to_int16_bytes


class BargeInConfig(BaseModel):
    """When an agent going silent counts as the caller barging in."""

    caller_dbfs: float = Field(-42.0, description="caller frame RMS above this counts as speech")
    min_agent_frames: int = Field(3, ge=1, description="agent speech before the stop (frames of 80 ms)")
    min_overlap_frames: int = Field(2, ge=1, description="caller speech overlapping the agent's last frames")


@dataclass
class AgentTurns:
    """Turns of agent speech from the per-frame stream (see the module docstring).

    Args:
        end_silence_frames: silent frames (80 ms each) without words that close a turn; 6 is 480 ms, longer
            than the pauses between the model's sentences.
    """

    end_silence_frames: int = 6
    speaking: bool = False
    turns: int = 0
    _silent_run: int = 0

    def step(self, *, silent: bool, text: str) -> list[Frame]:
        """Frames for one 80 ms agent frame (its audio goes out separately, before these)."""
        frames: list[Frame] = []
        if not silent or text:
            self._silent_run = 0
            if not self.speaking:
                self.speaking = True
                self.turns += 1
                frames += [LLMFullResponseStartFrame(), TTSStartedFrame()]
        elif self.speaking:
            self._silent_run += 1
            if self._silent_run >= self.end_silence_frames:
                frames += self.close()
        if text:
            frames += words(text)
        return frames

    def close(self) -> list[Frame]:
        """End the open turn now (barge-in, end of call); nothing when none is open."""
        if not self.speaking:
            return []
        self.speaking = False
        self._silent_run = 0
        return [TTSStoppedFrame(), LLMFullResponseEndFrame()]


def words(text: str) -> list[Frame]:
    """One word piece as Pipecat's speech-to-speech services push it: an `LLMTextFrame` for RTVI that stays
    out of the context, and the `TTSTextFrame` the assistant aggregator records (pieces carry their spaces)."""
    llm = LLMTextFrame(text)
    llm.append_to_context = False
    tts = TTSTextFrame(text, text_type=TextType.WORD)
    tts.includes_inter_frame_spaces = True
    return [llm, tts]


class AgentAudio:
    """The model's 24 kHz frames as `SpeechOutputAudioRawFrame`s at the pipeline's output rate.

    Resampled here, once, with a zero-latency resampler: at 8 kHz (Twilio) every 80 ms tick becomes 640
    samples straight away, which the output transport sends in steady 40 ms chunks. Frames the model marks
    silent go out as digital zero, so Pipecat's bot-speaking detection (silence = |sample| <= 20) works.
    """

    def __init__(self, rate: int, quality: Quality = "QQ") -> None:
        self.rate = rate
        self._resampler = StreamResampler(SAMPLE_RATE, rate, quality) if rate != SAMPLE_RATE else None

    def frame(self, pcm: np.ndarray, silent: bool) -> SpeechOutputAudioRawFrame:
        if self._resampler is not None:
            # silent frames still go through the resampler (its state stays continuous), but out as zeros
            pcm = self._resampler.process(np.zeros(FRAME_SIZE, np.float32) if silent else pcm)
        audio = bytes(pcm.size * 2) if silent else float_to_int16_bytes(pcm)
        return SpeechOutputAudioRawFrame(audio=audio, sample_rate=self.rate, num_channels=1)


class InterruptMark:
    """Marks where, in the output order, the service broadcasts an `InterruptionFrame` (a barge-in)."""


class BargeIn:
    """Spots the model stopping for the caller: `update` returns the agent run's length when it does."""

    def __init__(self, config: BargeInConfig | None = None) -> None:
        self.config = config or BargeInConfig()
        self._caller_thr = 10 ** (self.config.caller_dbfs / 20.0)
        self._agent_run = 0  # consecutive non-silent agent frames
        self._caller_run = 0  # consecutive caller frames above the speech threshold

    def update(self, caller_pcm: np.ndarray, agent_silent: bool) -> int | None:
        """One tick: the caller frame the model heard and whether the agent's frame is silent."""
        caller_rms = float(np.sqrt(np.mean(np.square(caller_pcm))))
        self._caller_run = self._caller_run + 1 if caller_rms > self._caller_thr else 0
        if not agent_silent:
            self._agent_run += 1
            return None
        spoke, self._agent_run = self._agent_run, 0
        cfg = self.config
        if spoke >= cfg.min_agent_frames and self._caller_run >= cfg.min_overlap_frames:
            return spoke
        return None


__all__ = ["AgentAudio", "AgentTurns", "BargeIn", "BargeInConfig", "InterruptMark", "words"]
