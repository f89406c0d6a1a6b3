#!/usr/bin/env python3
"""Rebuilds the caller recordings in tests/fixtures/audio/ from the phrases in PHRASES.json.

Each phrase is spoken by espeak-ng (en-us, 150 words a minute), then sox makes it 24 kHz mono 16-bit PCM
with half a second of silence before and after, as a caller leaves. The tests derive the 8 kHz mu-law and
the Twilio Media Streams forms from these wavs (tests/support.py), so only the wavs are committed.

    python scripts/make_fixtures.py            # rebuild every wav and SHA256SUMS
    python scripts/make_fixtures.py --check    # exit 1 when a committed file differs from SHA256SUMS

Needs the Debian packages espeak-ng and sox (`apt-get install espeak-ng sox`). A different espeak-ng
release may voice a phrase slightly differently: `--check` then fails on the new files, which is the
signal to look at them and commit the new SHA256SUMS with them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FOLDER = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "audio"
SUMS = FOLDER / "SHA256SUMS"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_sums() -> dict[str, str]:
    sums: dict[str, str] = {}
    for line in SUMS.read_text().splitlines():
        if line.strip():
            value, name = line.split(maxsplit=1)
            sums[name.strip()] = value
    return sums


def check() -> int:
    """0 when every file named in SHA256SUMS is present with that digest, else 1 (with a line each)."""
    bad = 0
    for name, value in read_sums().items():
        path = FOLDER / name
        if not path.is_file():
            print(f"missing: {path}", file=sys.stderr)
            bad += 1
        elif digest(path) != value:
            print(f"differs from SHA256SUMS: {path}", file=sys.stderr)
            bad += 1
    return 1 if bad else 0


def speak(text: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), text], check=True)
        subprocess.run(
            ["sox", str(raw), "-r", "24000", "-c", "1", "-b", "16", str(out), "pad", "0.5", "0.5"], check=True
        )


def rebuild() -> int:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            print(f"error: {tool} not found (apt-get install espeak-ng sox)", file=sys.stderr)
            return 2
    phrases: dict[str, str] = json.loads((FOLDER / "PHRASES.json").read_text())
    for name, text in phrases.items():
        speak(text, FOLDER / f"{name}.wav")
        print(f"{name}.wav: {text}")
    names = [*(f"{name}.wav" for name in sorted(phrases)), "PHRASES.json"]
    SUMS.write_text("".join(f"{digest(FOLDER / name)}  {name}\n" for name in names))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify the committed files against SHA256SUMS")
    args = parser.parse_args()
    return check() if args.check else rebuild()


if __name__ == "__main__":
    sys.exit(main())
