"""Calls a killed process left open (`duetaspan.pipeline.abandoned`): finished by the next start as a close
would have, the agent's card number gone from the journal, the record and the wav's agent channel; a live
call's journal, in this process or another, never touched; the window inside `close` covered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import wave

import numpy as np

from duetaspan.pipeline import artifacts
from duetaspan.pipeline.abandoned import finish_abandoned
from duetaspan.pipeline.artifacts import CallRecorder, load_call_record
from duetaspan.webhooks.redact import Redactor
from tests.support import REPO_ROOT, has_card

# the agent reads a card number back over frames 32-35; loud noise on both channels everywhere
KILLED_CALL = """
import os, signal, numpy as np
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.webhooks.redact import Redactor
rng = np.random.default_rng(3)
rec = CallRecorder({folder!r}, "CA-killed", meta={{"caller": "+14155552671", "transport": "twilio"}},
                   redactor=Redactor(["card"]))
tokens = {{30: " You", 31: " said", 32: " 4111", 33: " 1111", 34: " 1111", 35: " 1111,", 36: " is", 37: " that"}}
for k in range(60):
    rec.write_frame((rng.standard_normal(1920) * 0.2).astype(np.float32),
                    (rng.standard_normal(1920) * 0.2).astype(np.float32))
    rec.event("frame", i=k, t=round(k * 0.08, 3), text=tokens.get(k, ""))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _kill_a_call(folder) -> None:
    script = textwrap.dedent(KILLED_CALL.format(folder=str(folder)))
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=os.environ.copy(), timeout=120)
    assert proc.returncode == -signal.SIGKILL


def _pcm(path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        return np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)


def test_a_killed_calls_record_is_finished_and_the_agents_card_number_silenced(tmp_path):
    _kill_a_call(tmp_path)
    assert "4111" in (tmp_path / "CA-killed.jsonl").read_text()  # as said: the agent's words await the close
    assert not (tmp_path / "CA-killed.json").exists()
    assert finish_abandoned(tmp_path, Redactor(["card"]), idle_s=3600) == []  # written moments ago: left alone
    [record] = finish_abandoned(tmp_path, Redactor(["card"]), idle_s=0)
    assert record["call_id"] == "CA-killed" and record["complete"] is False
    assert record["summary"]["ended_by"] == "crashed" and record["recovered"]["frames"] == 60
    assert record["recovered"]["redacted"] is True and record["meta"]["caller"] == "+14155552671"
    assert record["transcript"] == "You said [card] is that"
    assert load_call_record(tmp_path, "CA-killed") == record
    for name in ("CA-killed.json", "CA-killed.jsonl"):
        assert not has_card((tmp_path / name).read_text()), name
    [span] = record["audio_redactions"]
    assert (span["channel"], span["start"], span["end"], span["kind"]) == ("agent", 2.41, 3.2, "card")
    pcm = _pcm(tmp_path / "CA-killed.wav")
    at = lambda s: round(s * 24000)  # noqa: E731
    assert pcm.shape == (60 * 1920, 2) and span["samples"] == at(3.2) - at(2.41)
    assert not pcm[at(2.41) : at(3.2), 1].any()
    kept = lambda x: np.count_nonzero(x) > 0.99 * x.size  # noqa: E731
    assert kept(pcm[: at(2.40), 1]) and kept(pcm[at(3.21) :, 1]) and kept(pcm[:, 0])
    assert finish_abandoned(tmp_path, Redactor(["card"]), idle_s=0) == []  # once


def test_without_redaction_the_killed_call_is_finished_as_said(tmp_path):
    _kill_a_call(tmp_path)
    [record] = finish_abandoned(tmp_path, None, idle_s=0)
    assert record["recovered"]["redacted"] is False and "4111" in record["transcript"]
    assert record["audio_redactions"] == [] and _pcm(tmp_path / "CA-killed.wav")[:, 1].any()


def test_a_live_calls_journal_is_never_taken(tmp_path):
    """The recorder's lock: however old its journal looks, a call still open (here, in this very process) is
    not finished under it, and closes normally afterwards."""
    rec = CallRecorder(tmp_path, "CA-live")
    rec.write_frame(np.zeros(1920, np.float32), np.zeros(1920, np.float32))
    rec.event("frame", i=0, t=0.0, text=" hi")
    before = (tmp_path / "CA-live.jsonl").read_text()
    assert finish_abandoned(tmp_path, idle_s=0) == []
    assert (tmp_path / "CA-live.jsonl").read_text() == before and not (tmp_path / "CA-live.json").exists()
    record = rec.close(ended_by="caller")
    assert record["complete"] is True and "recovered" not in record


def test_a_call_closing_is_not_taken_between_its_journal_and_its_record(tmp_path, monkeypatch):
    """`close` rewrites the redacted journal (a new file) before it writes the `.json`: the new journal is
    locked before it takes the old one's name, so a server finishing abandoned calls at that moment skips it."""
    seen = []
    write_atomic = artifacts.write_atomic

    def finishing_in_between(path, text):
        if path.suffix == ".json":
            seen.append(finish_abandoned(tmp_path, Redactor(["card"]), idle_s=0))
        write_atomic(path, text)

    monkeypatch.setattr(artifacts, "write_atomic", finishing_in_between)
    rec = CallRecorder(tmp_path, "CA-closing", redactor=Redactor(["card"]))
    for k, token in enumerate([" card", " 4111", " 1111", " 1111", " 1111"]):
        rec.write_frame(np.zeros(1920, np.float32), np.zeros(1920, np.float32))
        rec.event("frame", i=k, t=round(k * 0.08, 3), text=token)
    record = rec.close(ended_by="caller")
    assert seen == [[]]
    assert record["complete"] is True and json.loads((tmp_path / "CA-closing.json").read_text())["complete"]
