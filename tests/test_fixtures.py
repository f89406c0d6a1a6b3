"""The repository carries its own caller audio, and nothing in it reads from outside the repository.

A fresh clone anywhere (no `shared/` folder beside it) must pass the test suite: the 24 kHz wavs live in
tests/fixtures/audio with their SHA256SUMS, and the mu-law and Twilio Media Streams forms are derived from
them in tests/support.py.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from duetaspan.adapters.twilio.audio import ulaw_to_int16
from tests import support

REPO = support.REPO_ROOT
# A path that leaves the repository: the sibling `shared/` folder (in any spelling) or the workplace's root.
OUTSIDE = re.compile(
    r"""\.\./+shared|parent\s*/\s*["']shared["']|["']/work/|/work/shared|REPO_ROOT\.parent\b"""
)
SCANNED = ("tests", "examples", "benchmarks", "scripts", "sdk", "adapters", "tools", ".ci")


def tracked_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    return [REPO / name for name in out if name and (REPO / name).is_file()]


def test_committed_wavs_match_their_hashes():
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_fixtures.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    sums = (support.AUDIO_FIXTURES / "SHA256SUMS").read_text()
    for name in support.fixture_names():
        assert f"  {name}.wav" in sums


def test_every_fixture_derives_mulaw_and_a_twilio_stream():
    for name in support.fixture_names():
        pcm, rate = support.load_wav(name)
        assert rate == 24_000 and pcm.dtype == np.float32
        ulaw = support.load_ulaw(name)
        assert abs(len(ulaw) - len(pcm) / 3) <= 2, name
        # the mu-law carries the same speech: its level follows the wav's (not silence, not clipped)
        narrow = ulaw_to_int16(ulaw).astype(np.float32) / 32768.0
        assert 0.5 < np.sqrt(np.mean(narrow**2)) / np.sqrt(np.mean(pcm**2)) < 2.0, name
        messages = support.load_twilio_stream(name)
        assert [m["event"] for m in messages[:2]] == ["connected", "start"] and messages[-1]["event"] == "stop"
        media = messages[2:-1]
        assert all(m["event"] == "media" and len(base64.b64decode(m["media"]["payload"])) == 160 for m in media)
        assert b"".join(base64.b64decode(m["media"]["payload"]) for m in media).startswith(ulaw)
        assert [int(m["sequenceNumber"]) for m in messages[1:]] == list(range(1, len(messages)))
        assert messages[1]["start"]["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}


def test_a_missing_fixture_names_the_fix():
    with pytest.raises(FileNotFoundError, match=r"make_fixtures\.py"):
        support.load_wav("no_such_phrase")


def test_nothing_reads_from_outside_the_repository():
    me = Path(__file__).resolve()
    found = []
    for path in tracked_files():
        if path.resolve() == me or path.suffix in {".wav", ".png", ".ico", ".sqlite3"}:
            continue
        if path.relative_to(REPO).parts[0] not in SCANNED:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "paths outside the repository:\n" + "\n".join(found)


def test_the_outside_path_check_catches_what_it_should():
    for line in ('AUDIO = REPO_ROOT.parent / "shared" / "fixtures"', "open('../shared/fixtures/x.wav')",
                 'Path("/work/shared/fixtures")'):
        assert OUTSIDE.search(line), line


@pytest.mark.slow
@pytest.mark.serial  # runs a real-time part of the suite in a clone: CPU quiet
def test_a_clone_with_no_shared_folder_beside_it_passes(tmp_path):
    """A copy of the repository's files in a folder with nothing beside it runs a subset of the suite."""
    clone = tmp_path / "elsewhere" / "duetaspan"
    for path in tracked_files():
        target = clone / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    assert not (clone.parent / "shared").exists()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "tests/test_foundation.py", "tests/test_fixtures.py::test_every_fixture_derives_mulaw_and_a_twilio_stream",
         "tests/adapters/twilio/test_units.py", "examples/restaurant"],
        cwd=clone, capture_output=True, text=True, env=env, timeout=1500,
    )
    tail = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout and "error" not in done.stdout.splitlines()[-1], tail
