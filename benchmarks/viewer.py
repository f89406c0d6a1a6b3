"""Call viewer pages: size and render time against call length (what docs/operations.md quotes).

Usage:
    python benchmarks/viewer.py                       # 1, 10 and 30 minute calls
    python benchmarks/viewer.py --minutes 1,60 --audio embed

Each call is written through the real `CallRecorder` (stereo wav, event log, consolidated JSON): the caller
channel loops the shared fixture phrases with pauses, the agent channel answers in the pauses, there is agent
text every few frames and a `<ret>` with a landed span every 20 s. Printed per length: the page's size, the
share of it that is audio, and the wall time of `duetaspan view` (reading, waveform peaks, Opus encoding).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from duetaspan.model.convention import FRAME_SIZE
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.view import render_call
from tests.support import fixture_names, load_wav


def synthetic_call(folder: Path, minutes: float) -> Path:
    """A recorded call of `minutes` (its `.json`), made of fixture speech and recorder events."""
    phrases = [load_wav(name)[0] for name in fixture_names()]
    caller = np.concatenate([np.concatenate([p, np.zeros(24_000 * 2, np.float32)]) for p in phrases])
    agent = np.roll(caller, len(caller) // 2) * 0.8
    frames = int(minutes * 60 / 0.08)
    rec = CallRecorder(folder, f"bench-{minutes:g}m", meta={"transport": "bench"})
    for i in range(frames):
        at = (i * FRAME_SIZE) % (len(caller) - FRAME_SIZE)
        rec.write_frame(caller[at : at + FRAME_SIZE], agent[at : at + FRAME_SIZE])
        t = round(i * 0.08, 3)
        rec.event("frame", i=i, t=t, text=" word" if i % 4 == 0 else "", ret=False, silent=False,
                  concealed=i % 500 == 7, step_ms=5.0, lateness_ms=0.1)  # fmt: skip
        if i % 250 == 100:  # a <ret> every 20 s, its span 1 s later
            rec.event("ret", frame_index=i, t=t)
        if i % 250 == 112:
            rec.event("span", reference="(tool result) It is 3 PM in Tokyo.", frame_index=i, t=t, n_frames=12,
                      prefill_ms=4.0, question="What time is it?", tool="get_time",
                      arguments={"place": "Tokyo"}, latency_ms=960.0)  # fmt: skip
    rec.close()
    return rec.json_path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", default="1,10,30", help="call lengths, comma-separated")
    parser.add_argument("--audio", choices=("embed", "link", "none"), default="embed")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(f"{'call':>8} {'page':>9} {'audio':>7} {'render':>8}")
        for minutes in (float(m) for m in args.minutes.split(",")):
            record = synthetic_call(Path(tmp), minutes)
            started = time.perf_counter()
            page = render_call(record, audio=args.audio)
            took = time.perf_counter() - started
            text = page.read_text()
            audio = text.find('src="data:audio')
            audio_bytes = text.find('"', audio + 5) - audio if audio >= 0 else 0
            size = page.stat().st_size
            print(f"{minutes:>6g} m {size / 1e6:>7.2f} MB {100 * audio_bytes / size:>6.0f}% {took:>7.1f} s")


if __name__ == "__main__":
    main()
