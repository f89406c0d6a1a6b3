"""What answer detection decides: the verdicts, the tuning knobs, and one decision as data.

Verdicts: `human` (a person), `voicemail` (a greeting), `beep` (the voicemail's record tone: `beep_at_s` is
when it started, `beep_end_s` when it ended), `ivr` (a phone menu, or hold music), `screening` (iOS /
Android call screening asking who is calling), `silence` (nothing said), `fax` (fax or modem tones).
`MACHINE` are the verdicts that mean no person is on the line yet.

Example:
    >>> Verdict("human", 0.9, 1.62).machine
    False
    >>> Verdict("voicemail", 0.8, 2.44).as_json()["verdict"]
    'voicemail'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

VERDICTS = ("human", "voicemail", "beep", "ivr", "screening", "silence", "fax")
MACHINE = frozenset({"voicemail", "beep", "ivr", "screening", "fax"})


@dataclass(frozen=True)
class Verdict:
    """One decision: `verdict`, `confidence` (0..1), `decided_at_s` (seconds from the answer), how
    (`source`: `audio` or `asr`), the reason in words, and the beep's start and end when one was heard."""

    verdict: str
    confidence: float
    decided_at_s: float
    source: str = "audio"
    reason: str = ""
    beep_at_s: float | None = None
    beep_end_s: float | None = None
    transcript: str = ""

    @property
    def machine(self) -> bool:
        return self.verdict in MACHINE

    def as_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "confidence": round(self.confidence, 3),
                "decided_at_s": round(self.decided_at_s, 3), "source": self.source, "reason": self.reason,
                "beep_at_s": None if self.beep_at_s is None else round(self.beep_at_s, 3),
                "beep_end_s": None if self.beep_end_s is None else round(self.beep_end_s, 3),
                "transcript": self.transcript}  # fmt: skip


class DetectTuning(BaseModel):
    """The thresholds of the audio classifier (docs/outbound.md says how each was set and how to tune it)."""

    margin_db: float = Field(8.0, description="speech: this far above the noise floor")
    band_margin_db: float = Field(8.0, description="speech: or the voiced band (200-1600 Hz) this far above its "
                                  "own floor (a line's hiss spreads wider than a voice)")
    voicing: float = Field(0.55, description="a voiced frame: this periodic at a speaking pitch (0..1; over 1: off)")
    voiced_margin_db: float = Field(2.0, description="speech: or a voiced frame this far above the floor")
    min_level_db: float = Field(-52.0, description="speech: at least this loud (dBFS)")
    pause_s: float = Field(0.6, description="a pause this long ends an utterance")
    max_human_s: float = Field(2.2, description="a first utterance this short, then a pause, is a person")
    machine_s: float = Field(2.2, description="speech this long without a pause is a greeting")
    slow_human_s: float = Field(2.6, description="... unless it is slow: a first utterance this short with at most "
                                "`slow_syllables` syllables is still a person (0: off)")
    slow_syllables: int = Field(5, description="a slow person's few words: at most this many syllables")
    machine_active: float = Field(0.4, description="a greeting: at least this share of its frames sound (over "
                                  "`sound_margin_db`)")
    sound_margin_db: float = Field(6.0, description="a frame of a stretch of speech sounds this far above the floor")
    short_human_s: float = Field(1.0, description="a first utterance longer than this needs `long_pause_s` to end")
    long_pause_s: float = Field(0.75, description="the pause that ends a longer first utterance (a greeting's "
                                "first sentence pauses about as long as a person waiting)")
    silence_s: float = Field(3.5, description="nothing said this long: silence")
    recheck_s: float = Field(6.0, description="after a `human` verdict, listen this long for a machine's next "
                             "move: a beep, or the line reading on (0: not at all)")
    recheck_start_s: float = Field(1.0, description="the line reading on: speech starts again within this long of "
                                   "the `human` verdict and runs past `machine_s` without a pause, or comes to ...")
    reading_on_s: float = Field(4.0, description="... within this long of the verdict ...")
    reading_on_speech_s: float = Field(2.4, description="... this much speech (a greeting's next sentences; a person "
                                       "who said hello and hears the agent says little)")
    tone_purity: float = Field(0.8, description="a frame whose peak holds this share of its energy is tonal")
    tone_sideband_db: float = Field(-20.0, description="... and whose strongest energy one pitch (80-420 Hz) "
                                    "above the peak is under this, against the peak (a vowel's next harmonic)")
    beep_min_s: float = 0.18
    beep_max_s: float = 1.6
    beep_band_hz: tuple[float, float] = (380.0, 2050.0)
    beep_max_drift_hz: float = Field(8.0, description="a beep's pitch holds: its frames' peaks within this "
                                     "(a high voice's held vowel, its fundamental alone, glides 20-30 Hz)")
    music_level_sd_db: float = Field(3.0, description="hold music: level steadier than this (dB)")
    music_similarity: float = Field(0.76, description="hold music: consecutive spectra this alike")


__all__ = ["MACHINE", "VERDICTS", "DetectTuning", "Verdict"]
