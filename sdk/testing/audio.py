"""A scripted caller's voice: the short caller phrases shipped with the package (`phrases/`, Ogg/Opus at
16 kHz, rebuilt by scripts/make_phrases.py), any audio file, or text through a text-to-speech command.

Everything comes back as 24 kHz float32 mono in [-1, 1] (the model's rate), trimmed to the speech.

Example:
    >>> sorted(PHRASES)[:3]
    ['account_balance', 'book_table', 'greeting']
    >>> pcm = speech("book_table", seconds=1.0)
    >>> pcm.dtype, len(pcm) == 24000
    (dtype('float32'), True)
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

RATE = 24000
PHRASE_DIR = Path(__file__).parent / "phrases"
PHRASES: dict[str, str] = json.loads((PHRASE_DIR / "PHRASES.json").read_text())
DEFAULT_TTS = ("espeak-ng", "-s", "150", "-w", "{out}", "{text}")
AUDIO_SUFFIXES = (".wav", ".ogg", ".opus", ".flac", ".mp3")


class CallerAudioError(ValueError):
    """The caller's audio could not be made: an unknown phrase, an unreadable file, a failed TTS command."""


def read_audio(path: str | Path) -> np.ndarray:
    """An audio file (wav, ogg, flac...) as 24 kHz float32 mono."""
    import soundfile as sf
    import soxr

    try:
        pcm, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError) as exc:  # soundfile raises LibsndfileError (a RuntimeError)
        raise CallerAudioError(f"cannot read caller audio {path}: {exc}") from exc
    mono = pcm.mean(axis=1)
    return (soxr.resample(mono, rate, RATE) if rate != RATE else mono).astype(np.float32)


def trim(pcm: np.ndarray, threshold: float = 0.02) -> np.ndarray:
    """`pcm` cut to its speech (0.1 s kept either side)."""
    loud = np.flatnonzero(np.abs(pcm) > threshold)
    if not loud.size:
        return pcm
    return pcm[max(0, loud[0] - RATE // 10) : loud[-1] + RATE // 10]


def phrase_path(name: str) -> Path:
    """The file of shipped phrase `name`."""
    if name not in PHRASES:
        raise CallerAudioError(f"no caller phrase {name!r} (shipped: {', '.join(sorted(PHRASES))})")
    return PHRASE_DIR / f"{name}.ogg"


def is_audio_file(value: str | Path) -> bool:
    return isinstance(value, Path) or str(value).lower().endswith(AUDIO_SUFFIXES)


def speech(value: str | Path, seconds: float | None = None) -> np.ndarray:
    """A shipped phrase (by name) or an audio file, trimmed to its speech, optionally to its first `seconds`."""
    pcm = trim(read_audio(value if is_audio_file(value) else phrase_path(str(value))))
    return pcm[: int(seconds * RATE)] if seconds else pcm


def synthesize(text: str, command: Sequence[str] | str = DEFAULT_TTS, timeout_s: float = 60.0) -> np.ndarray:
    """`text` spoken by a TTS command that writes a wav: `{text}` and `{out}` in its arguments are replaced by
    the text and the output path (e.g. `espeak-ng -w {out} {text}`, the default)."""
    args = shlex.split(command) if isinstance(command, str) else list(command)
    with tempfile.TemporaryDirectory(prefix="duetaspan-tts-") as tmp:
        out = Path(tmp) / "say.wav"
        argv = [a.replace("{out}", str(out)).replace("{text}", text) for a in args]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CallerAudioError(f"TTS command {argv[0]!r} failed: {exc}") from exc
        if done.returncode != 0 or not out.is_file():
            raise CallerAudioError(
                f"TTS command {' '.join(argv)!r} exited {done.returncode} without writing {out.name}: "
                f"{done.stderr.decode(errors='replace').strip()[-500:]}"
            )
        return trim(read_audio(out))


__all__ = [
    "DEFAULT_TTS",
    "PHRASES",
    "CallerAudioError",
    "phrase_path",
    "read_audio",
    "speech",
    "synthesize",
    "trim",
]
