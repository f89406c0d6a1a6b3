"""The caller's side of a call as Pipecat frames, from the voice detection and ASR the SDK already runs.

The question capture (`duetaspan.router.capture`) cuts the caller's audio into utterances with Silero VAD and
transcribes each one as it ends. `CallerTurns` turns what it reports into the frames Pipecat's own
speech-to-speech services produce for the user:

    VAD speech start        UserStartedSpeakingFrame   (broadcast: both directions)
    VAD speech end          UserStoppedSpeakingFrame   (broadcast; ~`end_silence_s` after the last word)
    utterance transcribed   TranscriptionFrame         (upstream, to the user aggregator; finalized, with an
                                                        ISO-8601 timestamp of when the utterance started and
                                                        the caller's user id)

Times arrive as call stream times (seconds since the call's first caller frame); `iso(t)` maps them onto
the wall clock of the call's start.

Example:
    >>> turns = CallerTurns(user_id="+15550001111", started_at=0.0)
    >>> turns.transcription("what time is it", 1.5).timestamp
    '1970-01-01T00:00:01.500+00:00'
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field

from pipecat.frames.frames import TranscriptionFrame


@dataclass
class CallerTurns:
    """The caller's speaking state and transcripts (see the module docstring).

    Args:
        user_id: the `user_id` on transcriptions (the caller's number when known, else the call id).
        started_at: wall-clock time (epoch seconds) of call stream time 0.
    """

    user_id: str
    started_at: float = field(default_factory=time.time)
    speaking: bool = False
    last_stop_t: float | None = None  # stream time the caller's last utterance ended
    utterances: int = 0

    def started(self) -> bool:
        """The caller started speaking; True when that is news (a frame should go out)."""
        if self.speaking:
            return False
        self.speaking = True
        return True

    def stopped(self, t: float) -> bool:
        """The caller's utterance ended at stream time `t`; True when that is news."""
        self.last_stop_t = t
        if not self.speaking:
            return False
        self.speaking = False
        self.utterances += 1
        return True

    def iso(self, t: float) -> str:
        """Call stream time `t` as an ISO-8601 UTC timestamp (milliseconds)."""
        moment = dt.datetime.fromtimestamp(self.started_at + t, tz=dt.UTC)
        return moment.isoformat(timespec="milliseconds")

    def transcription(self, text: str, t: float) -> TranscriptionFrame:
        """The final transcript of an utterance that started at stream time `t`."""
        return TranscriptionFrame(text=text, user_id=self.user_id, timestamp=self.iso(t), finalized=True)


__all__ = ["CallerTurns"]
