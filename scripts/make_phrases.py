"""Rebuild the caller phrases shipped with `duetaspan.testing` (sdk/testing/phrases/) from the repository's
caller fixtures (tests/fixtures/audio): each trimmed to its speech, resampled to 16 kHz and stored as Ogg/Opus
(about 80 KB for all of them), with PHRASES.json saying what each one says.

    python scripts/make_phrases.py
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "fixtures" / "audio"
TARGET = ROOT / "sdk" / "testing" / "phrases"
RATE = 16000


def main() -> None:
    phrases = json.loads((SOURCE / "PHRASES.json").read_text())
    TARGET.mkdir(parents=True, exist_ok=True)
    for name in phrases:
        pcm, rate = sf.read(SOURCE / f"{name}.wav", dtype="float32")
        loud = np.flatnonzero(np.abs(pcm) > 0.02)
        pcm = pcm[max(0, loud[0] - rate // 10) : loud[-1] + rate // 10]
        sf.write(TARGET / f"{name}.ogg", soxr.resample(pcm, rate, RATE), RATE, format="OGG", subtype="OPUS")
    (TARGET / "PHRASES.json").write_text(json.dumps(phrases, indent=2) + "\n")
    total = sum(p.stat().st_size for p in TARGET.iterdir())
    print(f"{len(phrases)} phrases, {total} bytes in {TARGET.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
