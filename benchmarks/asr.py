#!/usr/bin/env python
"""Word error rate and time of a real speech recogniser on the repo's caller fixtures (tests/fixtures/audio).

Each fixture question is transcribed twice: as recorded (24 kHz, what the loopback and WebRTC transports
carry) and as a phone line carries it (8 kHz mu-law, Twilio and SIP G.711: resampled, encoded and decoded
with the SDK's own codec), by `[asr] kind = "whisper"` (`FasterWhisperClient`), the model loaded once.

    python benchmarks/asr.py                                  # base.en (downloaded on first use)
    python benchmarks/asr.py --model /path/to/tiny.en         # a local folder (model.bin, config.json, ...)
    python benchmarks/asr.py --model tiny.en --json           # one JSON object
    python benchmarks/asr.py --only book_table time_tokyo     # some fixtures

Word error rate: word-level edit distance to the fixture's words (tests/fixtures/audio/PHRASES.json), over
lowercased words without punctuation, with spelled digits and number words read alike ("123" = "one two
three"). ASR time: wall time of one transcription (the model already loaded), on this machine's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.adapters.asr.whisper import DEFAULT_MODEL, FasterWhisperClient
from duetaspan.adapters.twilio.audio import float_to_int16, int16_to_ulaw, ulaw_to_int16

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "audio"
_DIGITS = "zero one two three four five six seven eight nine".split()


def words(text: str) -> list[str]:
    """Lowercased words without punctuation; digits spelled one by one ("123" -> one two three)."""
    out: list[str] = []
    for token in re.findall(r"[a-z0-9']+", text.lower().replace("-", " ")):
        if token.isdigit():
            out += [_DIGITS[int(d)] for d in token]
        else:
            # "bc123" / "a1": letters and digits apart, each letter a word of its own when spelled together
            parts = re.findall(r"[a-z']+|\d", token)
            if len(parts) > 1:
                for part in parts:
                    out += (
                        [_DIGITS[int(part)]] if part.isdigit() else list(part) if len(part) <= 3 else [part]
                    )
            else:
                out.append(token)
    return out


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate: (substitutions + deletions + insertions) / reference words."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)] / max(1, len(ref))


def load(name: str) -> tuple[np.ndarray, int]:
    with wave.open(str(FIXTURES / f"{name}.wav"), "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768.0
        return pcm, w.getframerate()


def phone_line(pcm: np.ndarray, rate: int) -> tuple[np.ndarray, int]:
    """`pcm` as a G.711 phone line carries it: 8 kHz, mu-law encoded and decoded."""
    import soxr

    narrow = soxr.resample(pcm, rate, 8000).astype(np.float32)
    decoded = ulaw_to_int16(int16_to_ulaw(float_to_int16(np.clip(narrow, -1.0, 1.0))))
    return decoded.astype(np.float32) / 32768.0, 8000


async def measure(model: str, names: list[str]) -> dict[str, Any]:
    client = FasterWhisperClient(model, device="cpu")
    start = time.perf_counter()
    client.load()
    load_s = time.perf_counter() - start
    phrases = json.loads((FIXTURES / "PHRASES.json").read_text())
    rows = []
    for name in names:
        pcm, rate = load(name)
        for line, (audio, audio_rate) in (("24k", (pcm, rate)), ("ulaw8k", phone_line(pcm, rate))):
            start = time.perf_counter()
            heard = await client.transcribe(audio, audio_rate)
            rows.append(
                {
                    "fixture": name,
                    "line": line,
                    "audio_s": round(len(audio) / audio_rate, 2),
                    "asr_s": round(time.perf_counter() - start, 3),
                    "wer": round(wer(phrases[name], heard), 3),
                    "heard": str(heard),
                    "words": len(heard.words),
                }
            )
    await client.aclose()
    by_line = {
        line: round(float(np.mean([r["wer"] for r in rows if r["line"] == line])), 3)
        for line in ("24k", "ulaw8k")
    }
    return {"model": model, "load_s": round(load_s, 2), "rows": rows, "mean_wer": by_line}


def show(f: dict[str, Any]) -> str:
    lines = [
        f"{f['model']}: loaded in {f['load_s']:.1f} s",
        f"{'fixture':<16} {'line':<7} {'WER':>5} {'ASR s':>6}  heard",
    ]
    for r in f["rows"]:
        lines.append(f"{r['fixture']:<16} {r['line']:<7} {r['wer']:>5.2f} {r['asr_s']:>6.2f}  {r['heard']}")
    lines.append("mean WER: " + ", ".join(f"{k} {v:.3f}" for k, v in f["mean_wer"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"a Whisper size or a local folder ({DEFAULT_MODEL})"
    )
    parser.add_argument("--only", nargs="*", help="these fixtures (default: every one)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = args.only or sorted(p.stem for p in FIXTURES.glob("*.wav"))
    figures = asyncio.run(measure(args.model, names))
    print(json.dumps(figures, indent=1) if args.json else show(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
