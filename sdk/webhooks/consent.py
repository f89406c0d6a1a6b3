"""Recording consent (`[recording] consent`): the notice played first, word for word, and with `ask` the
caller's refusal honoured.

The notice is a wav file (`consent_audio`) or text rendered once by a TTS command (`consent_text` with
`consent_tts_command`, `{text}` and `{out}` substituted), resampled to the model's 24 kHz. While it plays it
replaces the agent's audio, frame by frame, in what the caller hears and in the recording (the model keeps
listening; its own words of those frames are dropped). With `ask`, a refusal until `consent_window_s` after
the notice ends (a `consent_refuse_digits` key, or a caller utterance that says no) means the call is not
recorded: `CallRecorder.discard_audio("consent_refused")` deletes the wav written since the first frame and
writes no more audio, and the record says `"recording": {"recorded": false, "reason": "consent_refused"}`.

Example:
    >>> import numpy as np
    >>> c = Consent("ask", np.ones(1920 * 2, np.float32), refuse_digits="2", window_s=5.0, recorder=None)
    >>> c.refuses("No, I don't want that"), c.refuses("no problem, go ahead"), c.refuses("yes")
    (True, False, False)
"""

from __future__ import annotations

import dataclasses
import logging
import re
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.errors import ConfigError
from duetaspan.model.convention import FRAME_SIZE, SAMPLE_RATE

log = logging.getLogger(__name__)
_NO = re.compile(r"^\W*(no|nope|no thanks|no thank you|i do not|i don't|don't record|do not record)\b", re.I)
_NOT_A_REFUSAL = re.compile(r"^\W*no (problem|worries)\b", re.I)


def load_notice(recording: Any) -> np.ndarray | None:
    """The notice as float32 mono at 24 kHz (None with `consent = "off"`); `ConfigError` when it cannot be
    read or rendered."""
    if recording.consent == "off":
        return None
    import soundfile
    import soxr

    path: Path | None = recording.consent_audio
    with tempfile.TemporaryDirectory(prefix="duetaspan-notice-") as tmp:
        if path is None:
            path = Path(tmp) / "notice.wav"
            argv = [a.replace("{text}", recording.consent_text).replace("{out}", str(path))
                    for a in shlex.split(recording.consent_tts_command)]  # fmt: skip
            try:
                subprocess.run(argv, check=True, capture_output=True, timeout=120)
            except (OSError, subprocess.SubprocessError) as exc:
                raise ConfigError(f"[recording] consent_tts_command failed: {exc}") from None
        try:
            pcm, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        except Exception as exc:
            raise ConfigError(f"[recording] consent notice {path}: cannot read it as audio: {exc}") from None
    mono = pcm.mean(axis=1)
    if rate != SAMPLE_RATE:
        mono = soxr.resample(mono, rate, SAMPLE_RATE).astype(np.float32)
    if not mono.size:
        raise ConfigError(f"[recording] consent notice {path} is empty")
    return mono.astype(np.float32)


class Consent:
    """One call's consent step: plays `notice` over the first frames; with `ask`, listens for a refusal."""

    def __init__(
        self, mode: str, notice: np.ndarray, *, refuse_digits: str, window_s: float, recorder: Any
    ) -> None:
        self.mode = mode
        self.notice = notice
        self.refuse_digits = refuse_digits
        self.window_s = window_s
        self.recorder = recorder
        self.frames = -(-notice.size // FRAME_SIZE)  # frames the notice takes, the last one padded
        self.played = 0
        self.refused = False
        self._window_end: float | None = None
        self.t = 0.0  # call time of the last frame seen

    @property
    def listening(self) -> bool:
        """Whether a refusal still counts (`ask`, during the notice or its window)."""
        return (
            self.mode == "ask"
            and not self.refused
            and (self._window_end is None or self.t < self._window_end)
        )

    def tick(self, out: Any) -> Any:
        """A service tick filter: the notice's next frame in place of the agent's while it plays."""
        self.t = out.t
        if self.played >= self.frames:
            return out
        chunk = self.notice[self.played * FRAME_SIZE : (self.played + 1) * FRAME_SIZE]
        chunk = np.pad(chunk, (0, FRAME_SIZE - chunk.size))
        self.played += 1
        if self.played == self.frames:
            self._window_end = out.t + 0.08 + self.window_s
            if self.recorder is not None:
                self.recorder.event("consent", mode=self.mode, notice_s=round(self.notice.size / SAMPLE_RATE, 3),
                                    t=round(out.t + 0.08, 3))  # fmt: skip
        result = dataclasses.replace(out.result, pcm=chunk, silent=False, text="", is_ret=False)
        return dataclasses.replace(out, result=result)

    @staticmethod
    def refuses(text: str) -> bool:
        """Whether an utterance refuses ("no", "no thanks", "don't record me"; not "no problem")."""
        return bool(_NO.search(text)) and not _NOT_A_REFUSAL.search(text)

    def heard(self, text: str) -> None:
        if self.listening and self.refuses(text):
            self.refuse(f"said {text!r}")

    def pressed(self, digit: str) -> None:
        if self.listening and digit and digit in self.refuse_digits:
            self.refuse(f"pressed {digit}")

    def refuse(self, how: str) -> None:
        self.refused = True
        log.info(
            "call %s: the caller refused recording (%s): not recorded",
            getattr(self.recorder, "call_id", "?"),
            how,
        )
        if self.recorder is not None:
            self.recorder.discard_audio("consent_refused")


def attach_consent(service: Any, recording: Any, notice: np.ndarray | None) -> Consent | None:
    """Start the consent step on a call's service (its recorder, DTMF, caller utterances, ticks)."""
    if recording.consent == "off" or notice is None:
        return None
    recorder = getattr(service, "recorder", None)
    consent = Consent(recording.consent, notice, refuse_digits=recording.consent_refuse_digits,
                      window_s=recording.consent_window_s, recorder=recorder)  # fmt: skip
    service.tick_filters.append(consent.tick)

    @service.event_handler("on_dtmf")
    async def _on_dtmf(_service: Any, digit: str) -> None:
        consent.pressed(str(digit))

    if recorder is not None:
        recorder.on_event.append(
            lambda kind, fields: (
                consent.heard(str(fields.get("text") or "")) if kind == "caller_utterance" else None
            )
        )
    return consent


__all__ = ["Consent", "attach_consent", "load_notice"]
