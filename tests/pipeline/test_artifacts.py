"""Call artifacts: readable while growing, complete after a normal end and an abrupt cancel, and after a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import wave

import numpy as np
import pytest

from duetaspan.pipeline.artifacts import CallRecorder, RecordDirError, check_record_dir, load_call_record
from duetaspan.pipeline.runner import EngineRunner
from duetaspan.pipeline.service import DuetaSpanService
from tests.pipeline.harness import chunks_at, run_call
from tests.pipeline.scripted_engine import ScriptedEngine
from tests.support import REPO_ROOT, load_wav


def _read_wav(path):
    with wave.open(str(path), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, 24000)
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)


def test_wav_is_valid_while_the_call_is_running(tmp_path):
    rec = CallRecorder(tmp_path, "CA+1/2")  # unsafe characters are mapped in file names
    caller = np.full(1920, 0.25, np.float32)
    agent = np.full(1920, -0.5, np.float32)
    for _ in range(3):
        rec.write_frame(caller, agent)
    data = _read_wav(rec.wav_path)  # not closed yet
    assert data.shape == (3 * 1920, 2)
    assert np.all(data[:, 0] == 8192) and np.all(data[:, 1] == -16384)  # left caller, right agent
    assert rec.wav_path.name == "CA_1_2.wav"
    rec.event("span", reference="x", arguments={"card": "****"})
    record = rec.close(extra=1)
    assert record["complete"] and record["summary"]["extra"] == 1 and record["spans"][0]["reference"] == "x"
    assert rec.json_path.exists() and load_call_record(tmp_path, "CA+1/2") == record


def test_unwritable_record_dir_fails_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(RecordDirError, match="not writable"):
        check_record_dir(blocker / "calls")
    with pytest.raises(RecordDirError):
        CallRecorder(blocker / "calls", "CA1")


def test_artifacts_are_private_whatever_the_umask(tmp_path):
    """Caller audio and transcripts: files 0600 and a record dir the SDK creates 0700, under the usual 022
    umask; an existing directory keeps the mode its owner gave it."""
    old = os.umask(0o022)
    try:
        rec = CallRecorder(tmp_path / "new" / "calls", "CA-modes")
        rec.write_frame(np.zeros(1920, np.float32), np.zeros(1920, np.float32))
        rec.close()
        (tmp_path / "mine").mkdir(mode=0o750)
        CallRecorder(tmp_path / "mine", "CA-other").close()
    finally:
        os.umask(old)
    calls = tmp_path / "new" / "calls"
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in [calls, *calls.iterdir()]}
    assert modes == {
        "calls": "0o700",
        "CA-modes.wav": "0o600",
        "CA-modes.jsonl": "0o600",
        "CA-modes.json": "0o600",
    }
    assert oct((tmp_path / "mine").stat().st_mode & 0o777) == "0o750"
    assert oct((tmp_path / "mine" / "CA-other.json").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("end", ["end", "cancel"])
async def test_artifacts_complete_after_end_and_abrupt_cancel(tmp_path, end):
    pcm, _ = load_wav("greeting")
    async with EngineRunner(ScriptedEngine()) as runner:
        rec = CallRecorder(tmp_path, f"CA-{end}")
        service = DuetaSpanService(runner, call_id=f"CA-{end}", recorder=rec)
        await run_call(service, chunks_at(pcm[: 24000 * 2], 8000), 8000, end=end, tail_s=0.1)
        assert runner.active_calls == 0  # the slot was freed
    record = load_call_record(tmp_path, f"CA-{end}")
    assert record["complete"] and record["summary"]["ended_by"] == end
    frames = record["summary"]["frames"]
    assert frames >= 20 and len(record["frames"]) == frames
    assert _read_wav(rec.wav_path).shape[0] == frames * 1920
    assert record["transcript"].startswith("hi")
    assert {"step_ms", "lateness_ms", "silent", "concealed"} <= set(record["frames"][0])


def test_killed_process_leaves_readable_artifacts(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, numpy as np
        from duetaspan.pipeline.artifacts import CallRecorder
        rec = CallRecorder({str(tmp_path)!r}, "CA-killed")
        for i in range(25):
            rec.write_frame(np.full(1920, 0.1, np.float32), np.zeros(1920, np.float32))
            rec.event("frame", i=i, t=i * 0.08, text=" w" if i % 5 == 0 else "")
        rec.event("ret", frame_index=24, t=1.92)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=os.environ.copy(), timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "CA-killed.json").exists()
    record = load_call_record(tmp_path, "CA-killed")
    assert not record["complete"] and len(record["frames"]) == 25 and record["rets"][0]["frame_index"] == 24
    assert record["transcript"] == "w w w w w"
    assert _read_wav(tmp_path / "CA-killed.wav").shape[0] == 25 * 1920
