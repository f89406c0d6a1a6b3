"""Tones in the phone band from the frames' spectral peaks: a run of tonal frames (purity over the tuning's
threshold) at a steady frequency is one tone, with its start, end and frequency. A tone is then a beep
(400-2000 Hz, 0.2-1.5 s), fax/modem CED (2100 Hz answer tone, 0.5 s or more), fax CNG (1100 Hz calling tone,
about 0.5 s, with nothing said before it), or a SIT/other tone that decides nothing.

Example:
    >>> tracker = ToneTracker(DetectTuning())
    >>> from duetaspan.outbound.dsp import Frame
    >>> done = [tracker.push(Frame((i + 1) * 0.02, -20.0, 1000.0, 0.95, 0.99)) for i in range(30)]
    >>> tone = tracker.push(Frame(0.62, -70.0, 500.0, 0.1, 0.1))
    >>> round(tone.start_s, 2), round(tone.duration_s, 2), round(tone.hz)
    (0.01, 0.59, 1000)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from duetaspan.outbound.dsp import FRAME_S, Frame
from duetaspan.outbound.verdicts import DetectTuning

CED_HZ, CNG_HZ, FAX_TOLERANCE_HZ = 2100.0, 1100.0, 35.0
SIT_HZ = (913.8, 1370.6, 1776.7)  # ITU-T E.180 special information tones
STEADY_HZ = 25.0  # a tone's frames stay this close to its running frequency


@dataclass
class Tone:
    start_s: float
    end_s: float
    hz: float
    level_db: float
    sideband_db: float = -120.0  # the median over its frames of what stands one pitch above its peak
    drift_hz: float = 0.0  # how far its frames' peak moved (highest less lowest, the edge frames left out)


    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def kind(self, tuning: DetectTuning, *, speech_before_s: float) -> str:
        """`ced`, `cng`, `sit`, `beep` or `other`."""
        if abs(self.hz - CED_HZ) <= FAX_TOLERANCE_HZ and self.duration_s >= 0.45:
            return "ced"
        if abs(self.hz - CNG_HZ) <= FAX_TOLERANCE_HZ and 0.35 <= self.duration_s <= 0.8 and speech_before_s < 0.3:
            return "cng"
        sit = any(abs(self.hz - hz) <= 25.0 for hz in SIT_HZ)
        if sit and 0.2 <= self.duration_s <= 0.45 and speech_before_s < 0.3:
            return "sit"  # the carrier's special information tones, before its intercept message
        lo, hi = tuning.beep_band_hz
        if self.sideband_db >= tuning.tone_sideband_db or self.drift_hz > tuning.beep_max_drift_hz:
            return "other"  # a held vowel: its next harmonic stands one pitch above the peak, or its pitch glides
        if lo <= self.hz <= hi and tuning.beep_min_s <= self.duration_s <= tuning.beep_max_s:
            return "beep"
        return "other"


class ToneTracker:
    """Feeds on frames; `push` returns a `Tone` when one has just ended (and `current` while one lasts)."""

    def __init__(self, tuning: DetectTuning) -> None:
        self.tuning = tuning
        self.current: Tone | None = None
        self._n = 0
        self._sum_hz = 0.0
        self._sidebands: list[float] = []
        self._peaks: list[float] = []

    def tonal(self, frame: Frame) -> bool:
        return frame.purity >= self.tuning.tone_purity and frame.level_db > self.tuning.min_level_db

    def voiced(self, frame: Frame) -> bool:
        """A pure frame that carries a voice's next harmonic one pitch above its peak: a held vowel's."""
        return frame.sideband_db >= self.tuning.tone_sideband_db

    def push(self, frame: Frame) -> Tone | None:
        start = frame.t - FRAME_S
        if self.tonal(frame):
            cur = self.current
            if cur is not None and abs(frame.peak_hz - self._sum_hz / self._n) <= STEADY_HZ:
                cur.end_s = frame.t
                self._n += 1
                self._sum_hz += frame.peak_hz
                cur.hz = self._sum_hz / self._n
                cur.level_db = max(cur.level_db, frame.level_db)
                self._sidebands.append(frame.sideband_db)
                self._peaks.append(frame.peak_hz)
                return None
            ended = self._close()
            self.current = Tone(start, frame.t, frame.peak_hz, frame.level_db)
            self._n, self._sum_hz, self._sidebands, self._peaks = 1, frame.peak_hz, [frame.sideband_db], [frame.peak_hz]
            return ended
        return self._close()

    def _close(self) -> Tone | None:
        tone, self.current = self.current, None
        # the first frame of a tone overlaps the silence before it (a 40 ms window): count from its middle
        if tone is not None and self._n >= 2:
            tone.start_s += FRAME_S / 2
            # by the middle of the run: its first and last frames straddle the tone's edges (their spectra splash)
            inner = slice(1, -1) if self._n > 2 else slice(None)
            tone.sideband_db = float(np.median(self._sidebands[inner]))
            tone.drift_hz = float(np.ptp(self._peaks[inner]))
            return tone
        return None


__all__ = ["CED_HZ", "CNG_HZ", "Tone", "ToneTracker"]
