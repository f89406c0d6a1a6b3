"""Calls whose process ended without closing them (`kill -9`, an out-of-memory kill, a crash, a power cut):
their `<id>.jsonl` journal and `<id>.wav` are on disk as far as they got, with no `<id>.json`. `serve` finishes
them when it starts on the record folder (`finish_abandoned`), as `CallRecorder.close` would have: the agent's
per-frame text redacted across frames and the wav's agent channel silenced over it (`[privacy] redact`: the
caller's side was redacted as it was written), the journal rewritten, and the record written with a
`recovered` entry, `complete: false` and `ended_by: "crashed"`. Its `call.ended` event and index row follow
(`duetaspan.webhooks.lifecycle.AfterCall.finish_abandoned`: at the server's start, and once more `IDLE_S`
later for the journals that were still too fresh then).

A journal is abandoned only when no open file holds its lock: a recorder locks its journal from the call's
start until its record is written (`journal.lock_journal`), and the kernel drops the lock with the process,
so the live calls of another server on the same folder, or of this one, are never touched. Where there are no
advisory locks (Windows) nothing is finished.

Example:
    >>> import numpy as np, tempfile
    >>> from duetaspan.pipeline.artifacts import CallRecorder
    >>> d = tempfile.mkdtemp()
    >>> rec = CallRecorder(d, "CA-live")  # live: its journal is locked
    >>> finish_abandoned(d, idle_s=0)
    []
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from duetaspan.model.convention import FRAME_MS, SAMPLE_RATE
from duetaspan.pipeline.artifacts import (
    Redact,
    _json_default,
    consolidate,
    read_events,
    redact_frames,
    silence_agent,
)
from duetaspan.pipeline.journal import lock_journal, replace_locked, write_atomic
from duetaspan.pipeline.redact_audio import WAV_HEADER, agent_spans

log = logging.getLogger(__name__)
REASON = "the process that ran the call ended without closing it"
IDLE_S = 30.0  # a live call writes its journal every 80 ms: one untouched this long is not being written


def finish_abandoned(
    record_dir: str | Path, redactor: Redact | None = None, *, idle_s: float = IDLE_S
) -> list[dict[str, Any]]:
    """Finish every abandoned call in `record_dir` (see the module docstring) whose journal nobody has written
    for `idle_s` (besides its lock: a server of an older version on the same folder, mid-deploy, does not
    lock its journals); their records, oldest first."""
    folder = Path(record_dir)
    if not folder.is_dir():
        return []
    now, idle = time.time(), []
    for journal in folder.glob("*.jsonl"):
        try:
            modified = journal.stat().st_mtime
        except FileNotFoundError:
            continue
        if now - modified >= idle_s and not journal.with_suffix(".json").exists():
            idle.append((modified, journal))
    finished = []
    for _, journal in sorted(idle):
        try:
            record = _finish(journal, redactor if redactor else None)
        except Exception:  # one unreadable journal must not stop the server's start or the others
            log.exception("%s: could not finish this abandoned call", journal)
            continue
        if record is not None:
            finished.append(record)
    return finished


def _finish(journal: Path, redactor: Redact | None) -> dict[str, Any] | None:
    try:
        fd = os.open(journal, os.O_RDONLY)
    except FileNotFoundError:  # closed (renamed over) or deleted since the listing
        return None
    try:
        # a live call holds the lock; one that closed since the listing has its `.json` now
        if not lock_journal(fd) or journal.with_suffix(".json").exists():
            return None
        events = read_events(journal)
        if not events or events[0].get("type") != "call_start":
            return None  # not a call's journal
        frames = sum(1 for ev in events if ev.get("type") == "frame")
        silenced: list[dict[str, Any]] = []
        wav_path = journal.with_suffix(".wav")
        if redactor is not None:
            redacted = redact_frames(events, redactor)
            spans = agent_spans(events, redacted, FRAME_MS / 1000.0)
            if spans and wav_path.exists():
                wav = os.open(wav_path, os.O_RDWR)
                try:
                    total = max(0, os.fstat(wav).st_size - WAV_HEADER) // 4
                    rate = int(events[0].get("sample_rate") or SAMPLE_RATE)
                    silenced = silence_agent(wav, spans, rate, total)
                finally:
                    os.close(wav)
            else:
                silenced = silence_agent(None, spans, SAMPLE_RATE, 0)
            events = redacted
        started = events[0].get("started_at")
        ended = started + frames * FRAME_MS / 1000.0 if isinstance(started, int | float) else None
        recovered = {"type": "recovered", "recovered_at": time.time(), "ended_at": ended, "frames": frames,
                     "reason": REASON, "redacted": redactor is not None}  # fmt: skip
        events = [*events, *silenced, recovered]
        lines = "".join(json.dumps(ev, ensure_ascii=False) + "\n" for ev in events)
        replaced = replace_locked(journal, lines)
        try:
            record = consolidate(events)
            text = json.dumps(record, default=_json_default, ensure_ascii=False, indent=1)
            write_atomic(journal.with_suffix(".json"), text)
        finally:
            os.close(replaced)
    finally:
        os.close(fd)
    log.warning(
        "call %s: %s; finished now (%d frames%s)", record.get("call_id"), REASON, frames,
        ", the agent's words redacted" if redactor is not None else "",
    )  # fmt: skip
    return record


__all__ = ["finish_abandoned"]
