"""Results in Full-Duplex-Bench v3's own layout (`duetaspan eval ... --export-fdb DIR [--provider NAME]`), and
the numbers the benchmark's scorers (`evaluate_tool_calls.py`, `evaluate_pass_rate.py`, exact rule) compute
from them.

Layout: one folder per sample, `DIR/<example_id>_<24 hex>/result_<provider>.json`, with `example_id`,
`actual_tool_calls` (`function`, `args`, `timestamp_start`, `timestamp_end`: seconds from the stream start)
and `transcript`; audio runs add `asr_chunks` (`text`, `timestamp: [start, end]`), `user_speech_end_rel` and
`audio_agent_speech_start`. The 24 hex digits are the released recording's own (`<id>_<24 hex>/input.wav`)
or a digest of the example id and the recording (its bytes; "text" in text mode; the words a TTS command
renders), so exporting the same run again overwrites instead of adding a sample.

The scorers' rules (written from their documented behaviour): per sample, tool-selection F1 over name
multisets and argument accuracy over FIFO-matched calls, each rounded to 3 digits; a pass needs equal name
multisets and every expected call's arguments right. Means are rounded to 3 digits: `*_all` over every
sample, the headline `tool_selection_acc` / `argument_acc` over turn-taken samples (a non-empty transcript
or ASR chunks); the pass rate over every sample.

Example:
    >>> rows = [{"id": "a", "example_id": "a", "expected_calls": [{"tool": "t", "args": {"x": "A_b"}}],
    ...          "actual_calls": [{"tool": "t", "args": {"x": "a b"}, "t": 0.5, "t_end": 0.6}], "answer": ""}]
    >>> s = official_summary(rows)
    >>> s["tool_selection_acc_all"], s["argument_acc_all"], s["overall_pass_rate"], s["tool_selection_acc"]
    (1.0, 1.0, 1.0, None)
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from duetaspan.errors import ConfigError
from duetaspan.eval.scenario import Scenario, Suite
from duetaspan.eval.scoring import args_match, tool_selection

log = logging.getLogger(__name__)

DEFAULT_PROVIDER = "duetaspan"
HEX_DIGITS = 24
_PROVIDER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_provider(name: str) -> str:
    """A provider name fit for `result_<provider>.json` (the scorers' `--provider`)."""
    if not _PROVIDER.match(name):
        raise ConfigError(
            f"--provider {name!r}: use letters, digits, '_', '-' or '.' (it names result_<provider>.json)"
        )
    return name


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(("fdb-v3", *parts)).encode()).hexdigest()[:HEX_DIGITS]


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:  # a recording that went away: its path still names it
        return str(path)


def recording_key(suite: Suite, scenario: Scenario, mode: str) -> str:
    """What identifies the sample's caller audio: "text" in text mode, else the recordings' bytes (or the
    words a TTS command renders)."""
    if mode == "text":
        return "text"
    paths = (
        [suite.resolve(scenario.audio)]
        if scenario.audio
        else [suite.resolve(t.audio) for t in scenario.turns]
    )
    texts = [t.text for t in scenario.turns]
    return "|".join(_file_digest(p) if p is not None else f"tts:{texts[i]}" for i, p in enumerate(paths))


def sample_folder(example_id: str, recording: str | None, key: str) -> str:
    """`<example_id>_<24 hex>`: the released recording's folder name when it has that shape, else a digest."""
    if recording and re.fullmatch(rf"{re.escape(example_id)}_[0-9a-f]{{{HEX_DIGITS}}}", recording):
        return recording
    return f"{example_id}_{_digest(example_id, key)}"


def result_record(row: dict[str, Any], *, audio: bool | None = None) -> dict[str, Any]:
    """A report row as the benchmark's `result_<provider>.json` (`audio`: with the audio fields, empty when
    the run produced none; default: when the row has them)."""
    calls = [
        {"function": c["tool"], "args": c["args"], "timestamp_start": c["t"], "timestamp_end": c.get("t_end")}
        for c in row["actual_calls"]
    ]
    record: dict[str, Any] = {
        "example_id": row.get("example_id") or row["id"],
        "actual_tool_calls": calls,
        "transcript": row.get("answer") or "",
    }
    stream = row.get("stream") or {}
    if audio or (audio is None and stream):
        record |= {
            "asr_chunks": stream.get("asr_chunks") or [],
            "user_speech_end_rel": stream.get("user_speech_end_rel"),
            "audio_agent_speech_start": stream.get("audio_agent_speech_start"),
        }
    return record


def write_export(
    suite: Suite, report: dict[str, Any], directory: Path, *, provider: str = DEFAULT_PROVIDER
) -> list[Path]:
    """Write one `result_<provider>.json` per report row under `directory`; returns the files written."""
    check_provider(provider)
    by_id = {s.id: s for s in suite.scenarios}
    written: dict[Path, str] = {}
    for row in report["scenarios"]:
        scenario = by_id[row["id"]]
        mode = report.get("mode", "text")
        record = result_record(row, audio=mode == "audio")
        key = recording_key(suite, scenario, mode)
        folder = sample_folder(str(record["example_id"]), scenario.meta.get("recording"), key)
        path = directory / folder / f"result_{provider}.json"
        if path in written:
            log.warning("--export-fdb: %s and %s are the same sample (%s): the second one is kept",
                        written[path], row["id"], folder)  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # a re-export replaces the file whole
        written[path] = row["id"]
    return list(written)


# --- the scorers' numbers --------------------------------------------------------------------------------------
def _sample(row: dict[str, Any]) -> dict[str, Any]:
    record = result_record(row)
    expected = [(c["tool"], c["args"]) for c in row["expected_calls"]]
    actual = [(c["function"], c.get("args") or {}) for c in record["actual_tool_calls"]]
    selection = tool_selection([n for n, _ in expected], [n for n, _ in actual])
    queues: dict[str, list[dict[str, Any]]] = {}
    for name, args in actual:
        queues.setdefault(name, []).append(args)
    oks = [bool(queues.get(n)) and args_match(want, queues[n].pop(0))[0] for n, want in expected]
    latency = None
    start, end = record.get("audio_agent_speech_start"), record.get("user_speech_end_rel")
    if start is not None and end is not None:
        latency = round(start - end, 3)
    return {
        "f1": round(selection.f1, 3),
        "args": round(sum(oks) / len(oks), 3) if oks else 1.0,
        "passed": not selection.missing and not selection.unexpected and all(oks),
        "turn_taken": bool(record["transcript"].strip()) or bool(record.get("asr_chunks")),
        "latency": latency,
    }


def _avg(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 3) if values else None


def official_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What `evaluate_tool_calls.py` and `evaluate_pass_rate.py` (no `--use-llm`) report for these rows'
    exported results (see the module docstring)."""
    samples = [_sample(r) for r in rows]
    taken = [s for s in samples if s["turn_taken"]]
    timed = [s["latency"] for s in taken if s["latency"] is not None]
    answered = [t for t in timed if t >= 0]
    n = len(samples)
    return {
        "rule": "exact",
        "n": n,
        "turn_taken": len(taken),
        "turn_take_rate": round(len(taken) / n, 3) if n else None,
        "tool_selection_acc": _avg([s["f1"] for s in taken]),
        "argument_acc": _avg([s["args"] for s in taken]),
        "tool_selection_acc_all": _avg([s["f1"] for s in samples]),
        "argument_acc_all": _avg([s["args"] for s in samples]),
        "overall_pass_rate": round(sum(s["passed"] for s in samples) / n, 3) if n else 0,
        "passed": sum(s["passed"] for s in samples),
        "interruption_rate": round((len(timed) - len(answered)) / len(timed), 3) if timed else None,
        "avg_response_latency_s": _avg(answered),
    }


# --- timing fields of an audio run ------------------------------------------------------------------------------
def voiced_frames(pcm: np.ndarray, rate: int, *, frame_s: float = 0.02) -> np.ndarray:
    """Which `frame_s` frames of `pcm` hold speech (RMS above a tenth of the loudest frame's, and above
    -50 dBFS)."""
    n = max(1, int(rate * frame_s))
    frames = pcm[: pcm.size // n * n].reshape(-1, n) if pcm.size >= n else pcm.reshape(1, -1)
    rms = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1)) if frames.size else np.zeros(0)
    if not rms.size:
        return np.zeros(0, bool)
    return np.asarray(rms > max(0.1 * float(rms.max()), 10 ** (-50 / 20)))


def speech_end_s(pcm: np.ndarray, rate: int, *, gap_s: float = 2.0, frame_s: float = 0.02) -> float | None:
    """The benchmark's `user_speech_end_rel` on audio: the end of the first stretch of speech followed by a
    silence longer than `gap_s`, else the end of the last one (seconds into `pcm`; None: no speech)."""
    voiced = voiced_frames(pcm, rate, frame_s=frame_s)
    idx = np.flatnonzero(voiced)
    if not idx.size:
        return None
    gaps = np.flatnonzero(np.diff(idx) * frame_s > gap_s)
    last = idx[gaps[0]] if gaps.size else idx[-1]
    return round(float((last + 1) * frame_s), 3)


def asr_chunks(words: Sequence[tuple[float, str]], *, frame_s: float) -> list[dict[str, Any]]:
    """The agent's text stream (pieces with their times, seconds from the stream start) as the benchmark's
    `asr_chunks`: one chunk per word, from its first piece to one frame after its last (or to the next word)."""
    chunks: list[dict[str, Any]] = []
    inside = False  # the last piece ended inside a word
    for t, piece in words:
        text = piece.strip()
        if text and inside and not piece[0].isspace():
            chunks[-1]["text"] += text
            chunks[-1]["timestamp"][1] = round(t + frame_s, 3)
        elif text:
            chunks.append({"text": text, "timestamp": [round(t, 3), round(t + frame_s, 3)]})
        inside = bool(text) and not piece[-1].isspace()
    for word, after in itertools.pairwise(chunks):  # a word ends where the next one starts, at the latest
        word["timestamp"][1] = max(word["timestamp"][0], min(word["timestamp"][1], after["timestamp"][0]))
    return chunks
