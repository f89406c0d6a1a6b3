"""The signal side of answer detection: incoming audio at any rate becomes the phone band (8 kHz, a streaming
anti-alias FIR from scipy, state kept across chunks), cut into 20 ms frames, and each frame gets its
features: level (dBFS), the strongest spectral peak between 300 and 2300 Hz with its purity (the share of
the band's energy within a few bins of it: near 1 for a beep or a fax tone, well under for speech or music),
how much its log spectrum resembles the previous frame's (sustained notes do, syllables do not), and its
voicing: how periodic the frame is at a speaking pitch (80-400 Hz), which tells a voiced syllable from a
line's noise at the same level.

The spectrum is a Hann-windowed 40 ms FFT (the last two frames, zero-padded to 1024 points: 7.8 Hz bins),
refined around the peak by parabolic interpolation; that is a plain FFT/Goertzel-class measurement from
numpy, nothing hand-written beyond reading the bins. Voicing is the highest normalised autocorrelation at a
pitch period, taken from the same spectrum (Wiener-Khinchin: the inverse FFT of the power) kept to the band
where voiced speech's harmonics stand over a line's noise, and divided by the Hann window's own
autocorrelation (Boersma's method, as in Praat's pitch tracker): near 1 for a vowel, near 0.3 for noise. And
the peak's sideband: the strongest energy one speaking pitch (80-420 Hz) above the peak, against the peak's
own; a voice's next harmonic stands there, a beep's line has only noise there (a held vowel whose one harmonic
holds most of its energy is as pure as a tone by its share, not by its neighbour).

Example:
    >>> import numpy as np
    >>> frames = PhoneFrames(16000)
    >>> t = np.arange(16000) / 16000
    >>> feats = [f for f in frames.push((0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32))]
    >>> round(feats[-1].peak_hz), feats[-1].purity > 0.9
    (1000, True)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

RATE = 8000
FRAME = 160  # 20 ms at 8 kHz
FRAME_S = FRAME / RATE
FFT_N = 1024
_BIN_HZ = RATE / FFT_N
_BAND = (int(300 / _BIN_HZ), int(2300 / _BIN_HZ) + 1)  # where tones are looked for
_SPEECH_BAND = (int(100 / _BIN_HZ), int(3800 / _BIN_HZ))
_VOICING_BAND = (int(200 / _BIN_HZ), int(1600 / _BIN_HZ) + 1)  # where voiced harmonics outstand line noise
_LAGS = (RATE // 400, RATE // 80 + 1)  # pitch periods of 80-400 Hz, in samples
_PEAK_HALF_WIDTH = 4  # bins each side counted as the peak's own energy (Hann main lobe plus a little drift)
# where a voice's next harmonic stands above its strongest one: one pitch (80-420 Hz) up, past the peak's main
# lobe (a 40 ms Hann window's spans ~6.4 bins each side); each candidate is read as a 5-bin cluster
_SIDE = (int(80 / _BIN_HZ), int(420 / _BIN_HZ) + 1)  # offsets of the next harmonic, in bins
_SIDE_HALF_WIDTH = 2
SUPPORTED_RATES = (8000, 16000, 24000, 32000, 48000)
_FLAT = 1e-5  # a frame whose samples span less than this (a 16-bit step is 3e-5) holds one code


@dataclass(frozen=True)
class Frame:
    """One 20 ms frame's features; `t` is its end, seconds from the first sample."""

    t: float
    level_db: float
    peak_hz: float
    purity: float
    similarity: float  # cosine of this and the previous frame's log spectra (0..1)
    voicing: float = 0.0  # the highest normalised autocorrelation at an 80-400 Hz pitch period (0..1)
    band_db: float = -120.0  # the level of the voiced band (200-1600 Hz) alone, dB (a relative scale)
    sideband_db: float = -120.0  # the strongest cluster one pitch (80-420 Hz) above the peak, against the peak, dB
    flat: bool = False  # every sample the same: a code sent for no signal (zeros, A-law's idle +8), not a line


class PhoneFrames:
    """Streaming: `push(pcm)` (float32 mono at `sample_rate`, any length) yields the finished 20 ms frames."""

    def __init__(self, sample_rate: int) -> None:
        if sample_rate not in SUPPORTED_RATES:
            raise ValueError(f"sample rate {sample_rate}: answer detection takes {', '.join(map(str, SUPPORTED_RATES))} Hz")
        self.sample_rate = sample_rate
        self.step = sample_rate // RATE
        self._taps = self._lfilter = None
        if self.step > 1:  # scipy.signal takes ~1 s to import: only when a call is detected, not at `serve` start
            from scipy.signal import firwin, lfilter, lfilter_zi

            self._taps, self._lfilter = firwin(63, 3600.0, fs=sample_rate), lfilter
            self._zi_unit = lfilter_zi(self._taps, 1.0)
        self._zi: np.ndarray | None = None  # the filter's state: set from the first sample (no start-up transient)
        self._phase = 0
        self._buf = np.zeros(0, dtype=np.float64)
        self._prev = np.zeros(FRAME, dtype=np.float64)
        self._window = np.hanning(2 * FRAME)
        w_ac = np.fft.irfft(np.abs(np.fft.rfft(self._window, FFT_N)) ** 2, FFT_N)
        self._window_ac = w_ac[_LAGS[0] : _LAGS[1]] / w_ac[0]
        self._last_log: np.ndarray | None = None
        self.frames = 0

    def push(self, pcm: np.ndarray) -> Iterator[Frame]:
        x = np.asarray(pcm, dtype=np.float64).reshape(-1)
        if self._taps is not None and self._lfilter is not None and len(x):
            if self._zi is None:  # as if the first sample had always been: a line's idle code stays one code
                self._zi = self._zi_unit * x[0]
            x, self._zi = self._lfilter(self._taps, 1.0, x, zi=self._zi)
            x = x[(-self._phase) % self.step :: self.step]
            self._phase = (self._phase + len(pcm)) % self.step
        self._buf = np.concatenate([self._buf, x])
        while len(self._buf) >= FRAME:
            frame, self._buf = self._buf[:FRAME], self._buf[FRAME:]
            yield self._features(frame)

    def _features(self, frame: np.ndarray) -> Frame:
        self.frames += 1
        level = 10.0 * np.log10(np.mean(frame**2) + 1e-12)
        both = np.concatenate([self._prev, frame]) * self._window
        self._prev = frame
        power = np.abs(np.fft.rfft(both, FFT_N)) ** 2
        lo, hi = _BAND
        k = lo + int(np.argmax(power[lo:hi]))
        peak_hz = k * _BIN_HZ
        if 0 < k < len(power) - 1:  # parabolic interpolation on the log power
            a, b, c = np.log(power[k - 1 : k + 2] + 1e-20)
            denom = a - 2 * b + c
            if denom != 0:
                peak_hz += 0.5 * (a - c) / denom * _BIN_HZ
        s_lo, s_hi = _SPEECH_BAND
        total = float(np.sum(power[s_lo:s_hi])) + 1e-20
        own = float(np.sum(power[max(0, k - _PEAK_HALF_WIDTH) : k + _PEAK_HALF_WIDTH + 1]))
        log_spec = np.log10(power[s_lo:s_hi] + 1e-10)
        log_spec = log_spec - log_spec.mean()
        similarity = 0.0
        if self._last_log is not None:
            norm = float(np.linalg.norm(log_spec) * np.linalg.norm(self._last_log)) + 1e-12
            similarity = max(0.0, float(np.dot(log_spec, self._last_log)) / norm)
        self._last_log = log_spec
        v_lo, v_hi = _VOICING_BAND
        band_db = 10.0 * np.log10(float(np.sum(power[v_lo:v_hi])) / FFT_N + 1e-12)
        return Frame(self.frames * FRAME_S, float(level), float(peak_hz), min(1.0, own / total), similarity,
                     self._voicing(power), band_db, self._sideband(power, k, own),
                     bool(np.ptp(frame) < _FLAT))  # fmt: skip

    @staticmethod
    def _sideband(power: np.ndarray, k: int, own: float) -> float:
        """A held vowel can put most of its energy in one harmonic, as pure as a beep by its share; the next
        harmonic still stands one pitch above it (a few to 20 dB down), where a beep's line has only noise.
        Above, not below: a line's noise (pink, brown, a street) is strongest at the low end, under a low beep."""
        lo, hi = _SIDE
        near = np.convolve(power[k + lo - _SIDE_HALF_WIDTH : k + hi + _SIDE_HALF_WIDTH], np.ones(2 * _SIDE_HALF_WIDTH + 1), mode="valid")
        if near.size == 0 or own <= 0.0:
            return -120.0
        return float(10.0 * np.log10(float(np.max(near)) / own + 1e-12))

    def _voicing(self, power: np.ndarray) -> float:
        band = np.zeros_like(power)
        lo, hi = _VOICING_BAND
        band[lo:hi] = power[lo:hi]
        ac = np.fft.irfft(band, FFT_N)
        if ac[0] <= 1e-12:
            return 0.0
        r = ac[_LAGS[0] : _LAGS[1]] / ac[0] / self._window_ac
        return float(min(1.0, max(0.0, np.max(r))))


def read_wav(path: str) -> tuple[np.ndarray, int]:
    """A mono wav as float32 in [-1, 1] and its rate (8/16/24 kHz and the others in `SUPPORTED_RATES`)."""
    import wave

    with wave.open(path, "rb") as w:
        channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
        raw = w.readframes(w.getnframes())
    if channels != 1:
        raise ValueError(f"{path}: {channels} channels; answer detection takes mono wav")
    if width == 2:
        pcm = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 1:
        pcm = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 4:
        pcm = np.frombuffer(raw, dtype="<i4").astype(np.float32) / 2147483648.0
    else:
        raise ValueError(f"{path}: {8 * width}-bit samples; 8, 16 or 32-bit PCM wav is needed")
    if rate not in SUPPORTED_RATES:
        raise ValueError(f"{path}: {rate} Hz; answer detection takes {', '.join(map(str, SUPPORTED_RATES))} Hz")
    return pcm, rate


__all__ = ["FRAME_S", "RATE", "SUPPORTED_RATES", "Frame", "PhoneFrames", "read_wav"]
