"""The bot-speaking state of a telephone output transport, read from the agent's audio itself (the model
streams silence too, so "audio is flowing" says nothing): `BotStartedSpeakingFrame` at the first non-silent
frame, `BotStoppedSpeakingFrame` after `BOT_STOP_SILENCE_S` of silence or at a barge-in, broadcast both ways as
Pipecat's own output transports do. The Twilio and SIP output processors share it.

Example:
    >>> BOT_STOP_SILENCE_S, SILENCE_LEVEL  # seconds of silence that end a bot turn; int16 silence level
    (0.35, 20)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pipecat.frames.frames import BotStartedSpeakingFrame, BotStoppedSpeakingFrame
from pipecat.processors.frame_processor import FrameProcessor

BOT_STOP_SILENCE_S = 0.35  # as Pipecat's output transports (BOT_VAD_STOP_SECS)
SILENCE_LEVEL = 20  # |int16 sample| at or below this is silence, as Pipecat's `is_silence`


class BotSpeechOutput(FrameProcessor):
    """A `FrameProcessor` that tracks whether the bot is speaking from the audio it sends."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.bot_speaking = False
        self._silence_s = 0.0

    async def _track_speech(self, pcm: np.ndarray, rate: int) -> None:
        """Feed one output frame (float PCM in [-1, 1] at `rate`)."""
        if np.abs(pcm).max(initial=0.0) * 32768.0 > SILENCE_LEVEL:
            self._silence_s = 0.0
            if not self.bot_speaking:
                self.bot_speaking = True
                await self.broadcast_frame(BotStartedSpeakingFrame)
        elif self.bot_speaking:
            self._silence_s += pcm.size / rate
            if self._silence_s >= BOT_STOP_SILENCE_S:
                await self._bot_stopped()

    async def _bot_stopped(self) -> None:
        if self.bot_speaking:
            self.bot_speaking = False
            self._silence_s = 0.0
            await self.broadcast_frame(BotStoppedSpeakingFrame)


__all__ = ["BOT_STOP_SILENCE_S", "SILENCE_LEVEL", "BotSpeechOutput"]
