"""Syllables in a stretch of speech, counted as it streams: how a slow person's "Yeah, this is Marcus." (five
syllables in 2.5 s at 90 words a minute) is told from a greeting's first 2.5 s (seven or more at any rate
but the slowest).

A syllable is a nucleus: a peak of the voiced band's level (200-1600 Hz, where a vowel's harmonics are) that
rose `prominence_db` over the dip before it and falls as far after it, and that is voiced or sounds over the
line's noise at its top (the approach of de Jong & Wempe's syllable-nuclei script for Praat, on 20 ms frames,
streamed). The level is smoothed over three frames first, so a flicker inside a vowel is not a second one.

Example:
    >>> n = Nuclei()
    >>> for level in [-60, -40, -30, -45, -60, -35, -30, -50, -60]:
    ...     n.push(level, voiced=True)
    >>> n.count
    2
"""

from __future__ import annotations

from collections import deque

_SMOOTH = 3  # frames


class Nuclei:
    """Streaming syllable-nucleus counter for one stretch of speech (`reset` at its start)."""

    def __init__(self, prominence_db: float = 3.0) -> None:
        self.prominence_db = prominence_db
        self.reset()

    def reset(self) -> None:
        self._done = 0  # nuclei confirmed: their level has fallen `prominence_db` since
        self._recent: deque[float] = deque(maxlen=_SMOOTH)
        self._dip = float("inf")  # the lowest level since the last nucleus
        self._peak: tuple[float, bool] | None = None  # a peak rising now: its level, whether it is voiced

    @property
    def count(self) -> int:
        """Nuclei so far, a voiced peak still rising (or not yet fallen far) included."""
        return self._done + int(self._peak is not None and self._peak[1])

    def push(self, band_db: float, voiced: bool) -> None:
        """One frame: the voiced band's level (dB) and whether the frame is voiced or sounds over the noise."""
        self._recent.append(band_db)
        x = sum(self._recent) / len(self._recent)
        if self._peak is None:
            self._dip = min(self._dip, x)
            if x - self._dip >= self.prominence_db:
                self._peak = (x, voiced)
        elif x > self._peak[0]:
            self._peak = (x, voiced)  # judged at its top
        elif self._peak[0] - x >= self.prominence_db:
            self._done += int(self._peak[1])
            self._peak, self._dip = None, x


__all__ = ["Nuclei"]
