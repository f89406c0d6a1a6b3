"""Caller-audio levelling toward -24 LUFS, applied before both the model and the ASR.

Quiet or narrowband phone audio is off-distribution for the model even when an ASR copes: the model was
trained on user audio around -24 LUFS (the training median). The leveller meters the RAW caller audio with
ITU-R BS.1770 integrated loudness (absolute -70 LUFS and relative -10 LU gates, so pauses do not count) over a
sliding window, and moves a smoothed gain toward `target - loudness`, clamped, with a per-frame anti-clipping
ceiling. It is open-loop (it meters its input, not its output), so it cannot oscillate. Below the gate
(silence, a muted line) the gain is held, so noise between words is not pumped up.

It does no denoising; a telephone line's noise floor is levelled with the speech.

Example:
    >>> import numpy as np
    >>> lev = Leveller(LevellerConfig(), sample_rate=24000)
    >>> quiet = (0.003 * np.sin(np.arange(24000 * 3) * 0.1)).astype(np.float32)
    >>> out = np.concatenate([lev.process(quiet[i:i + 1920]) for i in range(0, quiet.size - 1919, 1920)])
    >>> lev.gain_db > 10.0
    True
"""

from __future__ import annotations

import math
from collections import deque

import loudness
import numpy as np
from pydantic import BaseModel, Field

# The median loudness of the user audio the model was trained on.
USER_TARGET_LUFS = -24.0


class LevellerConfig(BaseModel):
    """Settings of the caller-audio leveller; `enabled=False` passes audio through untouched."""

    enabled: bool = True
    target_lufs: float = USER_TARGET_LUFS
    window_s: float = Field(3.0, gt=0.4, description="loudness window over the most recent caller audio")
    min_window_s: float = Field(0.4, ge=0.4, description="audio needed before the first measurement")
    min_gain_db: float = -24.0
    max_gain_db: float = 30.0
    smoothing_s: float = Field(0.4, ge=0.0, description="time constant of the gain moving to its target")
    measure_every_s: float = Field(0.16, gt=0.0, description="how often the loudness is re-measured")
    ceiling: float = Field(0.97, gt=0.0, le=1.0, description="peak level no gained sample may exceed")


def measure_lufs(pcm: np.ndarray, sample_rate: int) -> float:
    """BS.1770 integrated loudness of mono float32 audio; -inf for silence or audio under 400 ms."""
    if pcm.size < int(0.4 * sample_rate):
        return -math.inf
    return float(loudness.integrated_loudness(np.ascontiguousarray(pcm, dtype=np.float32), sample_rate))


class Leveller:
    """Streaming loudness levelling of one call's caller audio (one instance per call, not thread-safe)."""

    def __init__(self, config: LevellerConfig | None = None, *, sample_rate: int = 24000) -> None:
        self.config = config or LevellerConfig()
        self.sample_rate = sample_rate
        self.gain_db = 0.0
        self.loudness_lufs = -math.inf  # last raw measurement
        self._window: deque[np.ndarray] = deque()
        self._window_samples = 0
        self._since_measure = 0
        self._target_gain_db = 0.0

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def process(self, pcm: np.ndarray) -> np.ndarray:
        """Level one chunk (any length, float32 mono); returns a new array of the same length."""
        pcm = np.asarray(pcm, dtype=np.float32)
        if not self.config.enabled or pcm.size == 0:
            return pcm
        self._remember(pcm)
        self._since_measure += pcm.size
        if self._since_measure >= self.config.measure_every_s * self.sample_rate:
            self._since_measure = 0
            self._measure()
        start_db = self.gain_db
        if self.config.smoothing_s > 0:
            alpha = 1.0 - math.exp(-pcm.size / (self.config.smoothing_s * self.sample_rate))
        else:
            alpha = 1.0
        self.gain_db = start_db + (self._target_gain_db - start_db) * alpha
        # ramp across the chunk so gain changes do not click
        gains = np.power(10.0, np.linspace(start_db, self.gain_db, pcm.size, dtype=np.float32) / 20.0)
        out = pcm * gains
        peak = float(np.max(np.abs(out)))
        if peak > self.config.ceiling:
            out *= self.config.ceiling / peak
        return out.astype(np.float32, copy=False)

    def _remember(self, pcm: np.ndarray) -> None:
        self._window.append(pcm.copy())
        self._window_samples += pcm.size
        limit = int(self.config.window_s * self.sample_rate)
        while self._window and self._window_samples - self._window[0].size >= limit:
            self._window_samples -= self._window.popleft().size

    def _measure(self) -> None:
        if self._window_samples < self.config.min_window_s * self.sample_rate:
            return
        lufs = measure_lufs(np.concatenate(self._window), self.sample_rate)
        if not math.isfinite(lufs) or lufs < -70.0:
            return  # silence: hold the gain rather than boosting the noise floor
        self.loudness_lufs = lufs
        wanted = self.config.target_lufs - lufs
        self._target_gain_db = min(max(wanted, self.config.min_gain_db), self.config.max_gain_db)
