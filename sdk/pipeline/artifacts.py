"""Call artifacts: `<call id>.wav` (stereo 24 kHz, left caller, right agent) and the call's events, written
incrementally so that a crash, a kill or a dropped socket loses nothing already heard.

Files in the record directory, per call:

- `<call id>.wav`: 16-bit stereo PCM (not written with `audio=False`, `[recording] audio = false`). Every 80 ms frame is written straight to the OS (no user-space
  buffer) and the RIFF/data sizes in the header are patched right after, so the file is a valid wav at any
  moment; a process killed between the two writes leaves a header one frame short, still valid.
- `<call id>.jsonl`: JSON Lines, one event per line (`call_start`, `frame`, `ret`, `span`, `no_span`,
  `late_span`, `barge_in`, `caller_utterance`, `retrieval`, `error`, `call_end`), each line one `write`.
  A transport adds what it learns about the call: `meta` (fields merged into the record's `meta`, e.g. SIP's
  `direction`) and `rtp` (the record's `rtp`: packet, loss and jitter figures; the last one wins), the latter
  typically from a `before_close` callback, which runs just before `call_end` however the call ends.
- `<call id>.json`: the consolidated record, written atomically (temp file + rename) when the call closes.
  After a crash it is missing; `load_call_record()` then rebuilds the same structure from the `.jsonl`
  (ignoring a torn last line) and marks it `"complete": false`, and the next `serve` writes it
  (`duetaspan.pipeline.abandoned`: the journal is locked while its call is live). Its `turns` is the one two-sided transcript
  (`duetaspan.pipeline.transcript`); later steps (end-of-call analysis) add fields with `update_record`.

Privacy: with a `redactor` (`[privacy] redact`, `duetaspan.webhooks.redact.Redactor`) every event's text is
redacted before it is written, except the call's own numbers and names of things (`KEEP`); the agent's words
arrive one token per frame, so they are redacted across frames when the call closes (the `.jsonl` is then
rewritten redacted, before the `.json` is written). Events with the ASR's word times (`words`: a caller utterance,
a captured question) also redact the recording: the caller channel of the wav is silenced (zeros) where the
redacted words were said (`duetaspan.pipeline.redact_audio`), in what is written already and in frames still to
come; the agent's redacted tokens silence the agent channel over their frames at close
(`redact_audio.agent_spans`); an `audio_redaction` event (the record's `audio_redactions`) keeps each span's
channel, times and kind, never its words. `discard_audio()` deletes the wav of a call that must not
be recorded (a caller who refused consent) and writes no more frames.

Modes: the files hold what callers said (personal data), so they are created 0600 (owner only), and a record
directory the SDK creates is 0700; an existing directory keeps its mode (tighten it yourself).

Times: `t` is call time in seconds (frame index * 80 ms), the position in the wav. A `frame` event's
`caller_frame` is the caller-stream frame the wav holds there (-1: a concealed tick; null: not known), the
caller's times (utterances, word times) are on that stream: concealed ticks and dropped caller frames move it
against the wav.

Example:
    >>> import numpy as np, tempfile
    >>> d = tempfile.mkdtemp()
    >>> rec = CallRecorder(d, "CA1")
    >>> rec.write_frame(np.zeros(1920, np.float32), np.zeros(1920, np.float32))
    >>> rec.event("ret", frame_index=0, t=0.0)
    >>> record = rec.close()
    >>> load_call_record(d, "CA1")["rets"]
    [{'type': 'ret', 'frame_index': 0, 't': 0.0}]
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from duetaspan.errors import DuetaspanError
from duetaspan.model.convention import FRAME_MS, SAMPLE_RATE
from duetaspan.pipeline.journal import FILE_MODE, lock_journal, replace_locked, write_atomic
from duetaspan.pipeline.redact_audio import CallerTimeline, Span, agent_spans, redacted_words, zero_channel
from duetaspan.pipeline.transcript import turns

log = logging.getLogger(__name__)
_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
DIR_MODE = 0o700  # a record directory the SDK creates


# fields never redacted: the call's own numbers (index, do-not-call, data-subject deletes) and names of things
KEEP = frozenset(
    {"type", "call_id", "caller", "called", "transport", "direction", "tool", "kind", "state", "stage",
     "ended_by", "meta", "started_at", "ended_at", "sample_rate", "reason", "outcome", "who"}
)  # fmt: skip


class Redact(Protocol):
    """What the recorder needs of a redactor (`duetaspan.webhooks.redact.Redactor`)."""

    def __bool__(self) -> bool: ...
    def redact_value(self, value: Any, *, keep: frozenset[str] = ...) -> Any: ...
    def redact_pieces(self, pieces: list[str]) -> list[str]: ...
    def find(self, text: str) -> list[Any]: ...


class RecordDirError(DuetaspanError):
    """The record directory cannot be created or written; fix its path or permissions (or turn recording off)."""


def check_record_dir(record_dir: str | Path) -> Path:
    """Create the directory if needed and prove it is writable (at agent start, not at the first call)."""
    path = Path(record_dir)
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        probe = path / f".write-probe-{os.getpid()}"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE))
        probe.unlink()
    except OSError as exc:
        raise RecordDirError(f"record dir {str(path)!r} is not writable: {exc.strerror or exc}") from exc
    return path


def _wav_header(data_bytes: int, sample_rate: int, channels: int) -> bytes:
    block = channels * 2
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        36 + data_bytes,
        b"WAVE",
        b"fmt ",
        16,
        1,
        channels,
        sample_rate,
        sample_rate * block,
        block,
        16,
        b"data",
        data_bytes,
    )


def silence_agent(wav: int | None, spans: list[Span], sample_rate: int, total: int) -> list[dict[str, Any]]:
    """Zero the agent channel of the open wav `wav` (`total` samples) over `spans` (wav seconds); their
    `audio_redaction` events."""
    out = []
    for span in spans:
        a, b = int(span.start * sample_rate), min(total, int(np.ceil(span.end * sample_rate)))
        samples = zero_channel(wav, [(a, b)], 1) if wav is not None else 0
        out.append({"type": "audio_redaction", "channel": "agent", "start": span.start, "end": span.end,
                    "kind": span.kind, "samples": samples})  # fmt: skip
    return out


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


class CallRecorder:
    """Writes one call's wav and event log as the call goes. Not thread-safe: use from the call's loop."""

    def __init__(
        self,
        record_dir: str | Path,
        call_id: str,
        *,
        sample_rate: int = SAMPLE_RATE,
        meta: dict[str, Any] | None = None,
        audio: bool = True,
        redactor: Redact | None = None,
    ) -> None:
        self.dir = check_record_dir(record_dir)
        self.redactor = redactor if redactor else None
        self.call_id = call_id
        stem = _SAFE_ID.sub("_", call_id) or "call"
        self.wav_path: Path | None = self.dir / f"{stem}.wav" if audio else None
        self.jsonl_path = self.dir / f"{stem}.jsonl"
        self.json_path = self.dir / f"{stem}.json"
        self.sample_rate = sample_rate
        self.frames = 0
        self._data_bytes = 0
        self.closed = False
        self.before_close: list[Callable[[], object]] = []  # e.g. a transport writing its `rtp` event
        self.after_close: list[Callable[[dict[str, Any]], object]] = []  # with the record (e.g. the call index)
        self.on_event: list[Callable[[str, dict[str, Any]], object]] = []  # each event as written (not frames)
        self._wav: int | None = None
        self._timeline = CallerTimeline(FRAME_MS / 1000.0)  # wav frame -> caller-stream frame
        self._frame_samples = 0
        self.audio_redactions: list[Span] = []
        try:
            if self.wav_path is not None:
                self._wav = os.open(self.wav_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, FILE_MODE)
            self._log = os.open(
                self.jsonl_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, FILE_MODE
            )
            lock_journal(self._log)  # held until the record is written: the journal of a live call
        except OSError as exc:
            if self._wav is not None:
                os.close(self._wav)
            raise RecordDirError(f"cannot create artifacts for call {call_id} in {self.dir}: {exc}") from exc
        if self._wav is not None:
            os.write(self._wav, _wav_header(0, sample_rate, 2))
        self.event(
            "call_start", call_id=call_id, started_at=time.time(), sample_rate=sample_rate, meta=meta or {}
        )
        self.event("recording", recorded=audio, **({} if audio else {"reason": "audio off"}))

    def discard_audio(self, reason: str) -> None:
        """Stop recording audio and delete the wav written so far (the `recording` event says why)."""
        if self._wav is not None:
            os.close(self._wav)
            self._wav = None
        if self.wav_path is not None:
            self.wav_path.unlink(missing_ok=True)
            self.wav_path = None
            self._data_bytes = 0
        self.event("recording", recorded=False, reason=reason)

    def write_frame(self, caller: np.ndarray, agent: np.ndarray, caller_frame: int | None = None) -> None:
        """Append one frame of caller (left) and agent (right) audio, float32 of equal length; `caller_frame`
        is the caller-stream frame it holds (-1: none; None: the wav's own frame number)."""
        if self.closed:
            return
        self._timeline.add(self.frames if caller_frame is None else caller_frame)
        self.frames += 1
        if self._wav is None:  # audio=False: the frame count still goes into the summary
            return
        self._frame_samples = self._frame_samples or caller.size
        stereo = np.empty((caller.size, 2), dtype=np.float32)
        stereo[:, 0] = caller
        for span in self.audio_redactions:  # speech already known to be redacted (the ASR ran ahead)
            for _, s0, s1 in self._timeline.cuts(span, caller.size, first=self.frames - 1):
                stereo[s0:s1, 0] = 0.0
        stereo[:, 1] = agent
        pcm = (np.clip(stereo, -1.0, 32767 / 32768) * 32768.0).astype("<i2").tobytes()
        os.write(self._wav, pcm)
        self._data_bytes += len(pcm)
        os.pwrite(self._wav, struct.pack("<I", 36 + self._data_bytes), 4)
        os.pwrite(self._wav, struct.pack("<I", self._data_bytes), 40)

    def tick(self, out: Any) -> None:
        """One engine tick (a `duetaspan.pipeline.runner.TickOutput`): both channels of the wav, a `frame` event."""
        r = out.result
        caller_frame = -1 if out.concealed else getattr(out, "caller_frame", None)
        agent = np.zeros_like(out.caller_pcm) if r.silent else r.pcm
        self.write_frame(out.caller_pcm, agent, caller_frame)
        self.event(
            "frame",
            i=out.call_frame,
            t=round(out.t, 3),
            engine_frame=r.frame_index,
            text=r.text,
            ret=bool(r.is_ret),
            silent=bool(r.silent),
            concealed=out.concealed,
            caller_frame=caller_frame,
            step_ms=round(float(r.step_ms), 3),
            lateness_ms=round(out.lateness_ms, 3),
        )

    def event(self, kind: str, /, **fields: Any) -> None:
        """Append one event line (`{"type": kind, **fields}`)."""
        if self.closed:
            return
        spans: list[Span] = []
        if self.redactor is not None and isinstance(fields.get("words"), list) and fields["words"]:
            spans, words = redacted_words(fields["words"], self.redactor)
            fields = {**fields, "words": words}
        if self.redactor is not None and kind not in ("frame", "call_start", "meta", "rtp"):
            fields = self.redactor.redact_value(json.loads(json.dumps(fields, default=_json_default)), keep=KEEP)
        line = json.dumps({"type": kind, **fields}, default=_json_default, ensure_ascii=False)
        os.write(self._log, (line + "\n").encode())
        if spans:
            self._redact_audio(spans)
        if kind != "frame":
            for listener in self.on_event:
                try:
                    listener(kind, fields)
                except Exception:
                    log.exception("call %s: an event listener failed", self.call_id)

    def _redact_audio(self, spans: list[Span]) -> None:
        """Silence the caller channel of `spans` in the frames written so far, remember them for later frames,
        and note each one (times and kind) in the event log."""
        for span in spans:
            if any(old.start <= span.start and span.end <= old.end for old in self.audio_redactions):
                continue  # already silenced (the utterance and the question it became carry the same words)
            self.audio_redactions.append(span)
            cuts = self._timeline.cuts(span, self._frame_samples) if self._wav is not None else []
            n = self._frame_samples
            ranges = [(j * n + a, j * n + b) for j, a, b in cuts]
            samples = zero_channel(self._wav, ranges, 0) if self._wav is not None else 0
            self.event("audio_redaction", channel="caller", start=span.start, end=span.end, kind=span.kind,
                       samples=samples)  # fmt: skip

    def close(self, **summary: Any) -> dict[str, Any]:
        """Finish the call: `call_end` event, consolidated JSON. Idempotent; returns the record."""
        if self.closed:
            return load_call_record(self.dir, self.call_id)
        for callback in self.before_close:
            try:
                callback()
            except Exception:
                log.exception("call %s: a before_close callback failed", self.call_id)
        self.event("call_end", ended_at=time.time(), frames=self.frames, **summary)
        self.closed = True
        journal = self._log  # its lock held until the `.json` is written (`finish_abandoned` skips it)
        try:
            events = read_events(self.jsonl_path)
            if self.redactor is not None:
                redacted = redact_frames(events, self.redactor)
                spans = agent_spans(events, redacted, FRAME_MS / 1000.0)
                silenced = silence_agent(self._wav, spans, self.sample_rate, self._data_bytes // 4)
                events = redacted[:-1] + silenced + redacted[-1:]  # before `call_end`
            if self._wav is not None:
                os.close(self._wav)
            if self.redactor is not None:
                lines = "".join(json.dumps(ev, ensure_ascii=False) + "\n" for ev in events)
                journal = replace_locked(self.jsonl_path, lines)
                os.close(self._log)
            record = consolidate(events)
            write_atomic(self.json_path, json.dumps(record, default=_json_default, ensure_ascii=False, indent=1))
        finally:
            os.close(journal)
        for callback in self.after_close:
            try:
                callback(record)
            except Exception:
                log.exception("call %s: an after_close callback failed", self.call_id)
        return record


def redact_frames(events: list[dict[str, Any]], redactor: Redact) -> list[dict[str, Any]]:
    """The events with the agent's per-frame text pieces redacted as one text (a card number read out over
    twenty frames is found and blanked in all of them)."""
    at = [i for i, ev in enumerate(events) if ev.get("type") == "frame" and ev.get("text")]
    pieces = redactor.redact_pieces([str(events[i]["text"]) for i in at])
    out = list(events)
    for i, piece in zip(at, pieces, strict=True):
        if piece != events[i]["text"]:
            out[i] = {**events[i], "text": piece}
    return out


def update_record(record_dir: str | Path, call_id: str, **fields: Any) -> dict[str, Any]:
    """Add or replace top-level fields of a closed call's `.json` (atomically); returns the record."""
    record = load_call_record(record_dir, call_id)
    record.update(fields)
    text = json.dumps(record, default=_json_default, ensure_ascii=False, indent=1)
    write_atomic(record_json_path(record_dir, call_id), text)
    return record


def read_events(jsonl_path: str | Path) -> list[dict[str, Any]]:
    """The events of a `.jsonl`, skipping a torn final line (a process killed mid-write)."""
    events = []
    for line in Path(jsonl_path).read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


_LISTS = {
    "ret": "rets",
    "span": "spans",
    "persona_pin": "persona_pins",
    "no_span": "no_spans",
    "late_span": "late_spans",
    "span_dropped": "dropped_spans",
    "barge_in": "barge_ins",
    "caller_utterance": "caller_utterances",
    "retrieval": "retrieval_events",
    "error": "errors",
    "audio_redaction": "audio_redactions",
}



def consolidate(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Fold an event log into the call record (the `.json` layout)."""
    record: dict[str, Any] = {
        "call_id": None,
        "meta": {},
        "complete": False,
        "frame_ms": FRAME_MS,
        "transcript": "",
        "turns": [],
        "agent_text": [],
        "frames": [],
        **{name: [] for name in _LISTS.values()},
        "summary": {},
    }
    words = []
    for ev in events:
        kind = ev.get("type")
        if kind == "call_start":
            record["call_id"] = ev.get("call_id")
            record["meta"] = ev.get("meta", {})
            record["started_at"] = ev.get("started_at")
            record["sample_rate"] = ev.get("sample_rate")
        elif kind == "call_end":
            record["complete"] = True
            record["ended_at"] = ev.get("ended_at")
            record["summary"] = {k: v for k, v in ev.items() if k not in ("type", "ended_at")}
        elif kind == "frame":
            record["frames"].append({k: v for k, v in ev.items() if k != "type"})
            if ev.get("text"):
                record["agent_text"].append({"frame_index": ev["i"], "t": ev["t"], "text": ev["text"]})
                words.append(ev["text"])
        elif kind == "meta":
            record["meta"] = {**record["meta"], **{k: v for k, v in ev.items() if k != "type"}}
        elif kind == "rtp":
            record["rtp"] = {k: v for k, v in ev.items() if k != "type"}
        elif kind == "recording":
            record["recording"] = {k: v for k, v in ev.items() if k != "type"}
        elif kind == "recovered":  # finished by a later process (`abandoned.py`): still not complete
            record["recovered"] = {k: v for k, v in ev.items() if k != "type"}
            record["ended_at"] = ev.get("ended_at")
            record["summary"] = {"ended_by": "crashed", "frames": ev.get("frames")}
        elif kind in _LISTS:
            record[_LISTS[kind]].append(ev)
    record["transcript"] = "".join(words).strip()
    record["turns"] = turns(record["agent_text"], record["caller_utterances"])
    return record


def record_json_path(record_dir: str | Path, call_id: str) -> Path:
    """Where the closed call `call_id`'s record (`<id>.json`) lies in `record_dir`."""
    return Path(record_dir) / f"{_SAFE_ID.sub('_', call_id) or 'call'}.json"


def load_call_record(record_dir: str | Path, call_id: str) -> dict[str, Any]:
    """The call's record: the consolidated `.json`, or rebuilt from the `.jsonl` after a crash."""
    json_path = record_json_path(record_dir, call_id)
    if json_path.exists():
        return json.loads(json_path.read_text())
    return consolidate(read_events(json_path.with_suffix(".jsonl")))
