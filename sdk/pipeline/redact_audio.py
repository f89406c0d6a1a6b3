"""Recording redaction by word times (`[privacy] redact`): where the caller said something that is redacted (a
card number, an SSN...), the stored wav's caller channel is replaced by SILENCE (digital zero: no tone, so a
listener hears a gap and an analyst sees an exact flat line) over the words' times, padded by `PAD_S` either
side (recognisers' word times are approximate).

The words come from the ASR (`Word`s on a `Transcript`, in the events as `{"word", "start", "end"}` in the
call's caller-stream time). Their text is joined and searched by the same redactor as the transcript (also with
punctuation stripped, so "4111, 1111, ..." read as groups is found); each word that overlaps a match is
redacted, and in the stored `words` a run of them becomes one `{"word": "[kind]"}` with the run's times.

The agent's side: the agent's text arrives one token per 80 ms frame, in step with its audio in the wav, and
is redacted across frames when the call closes (`artifacts.redact_frames`). `agent_spans` compares the frames'
text before and after: each run of redacted tokens is a span of wav time, from `PAD_S` before the first
token's frame to `AGENT_TAIL_S` after the last one's end (a token's audio can trail its text: the acoustic
codebooks lag a frame and a word's sound outlasts its token), and the agent channel is silenced there, so an
agent reading a card number back leaves no digits in either channel.

`CallerTimeline` maps caller-stream time to positions in the wav: the wav holds one frame per engine tick,
and a tick may hold no caller audio (concealed: the caller's audio was late) or skip caller frames (dropped),
so the two differ once the line misbehaves.

Example:
    >>> from duetaspan.webhooks.redact import Redactor
    >>> words = [{"word": w, "start": i * 0.5, "end": i * 0.5 + 0.4} for i, w in
    ...          enumerate("card 4111 1111 1111 1111 thanks".split())]
    >>> spans, kept = redacted_words(words, Redactor(["card"]))
    >>> spans, [w["word"] for w in kept]
    ([Span(start=0.35, end=2.55, kind='card')], ['card', '[card]', 'thanks'])
"""

from __future__ import annotations

import os
import re
import string
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

PAD_S = 0.15  # seconds of audio silenced before and after the redacted words
AGENT_TAIL_S = 0.32  # seconds of the agent's audio silenced after its last redacted token's frame
WAV_HEADER = 44  # bytes before the samples of the wav `CallRecorder` writes (16-bit stereo PCM)
_LABEL = re.compile(r"\[([a-z]+)\]")
_PUNCT = string.punctuation.replace("@", "").replace("-", "")


class Finds(Protocol):
    """What is needed of a redactor (`duetaspan.webhooks.redact.Redactor.find`)."""

    def find(self, text: str) -> list[Any]: ...


@dataclass(frozen=True)
class Span:
    """Caller-stream seconds [start, end) of redacted speech, and what it was."""

    start: float
    end: float
    kind: str


def _word_hits(texts: list[str], redactor: Finds) -> dict[int, str]:
    """Index of each word (of `texts`, joined by spaces) inside a match -> the match's kind."""
    offsets, at = [], 0
    for text in texts:
        offsets.append((at, at + len(text)))
        at += len(text) + 1
    hits: dict[int, str] = {}
    for m in redactor.find(" ".join(texts)):
        for i, (start, end) in enumerate(offsets):
            if end > start and start < m.end and end > m.start:
                hits.setdefault(i, str(m.kind))
    return hits


def redacted_words(words: list[Any], redactor: Finds, pad_s: float = PAD_S) -> tuple[list[Span], list[Any]]:
    """The (padded) spans of redacted speech among `words`, and `words` with each redacted run as one
    `[kind]` word. Malformed entries (no text or times) are kept as they are and never redacted."""
    valid = [
        i for i, w in enumerate(words)
        if isinstance(w, dict) and isinstance(w.get("word"), str)
        and isinstance(w.get("start"), (int, float)) and isinstance(w.get("end"), (int, float))
    ]  # fmt: skip
    texts = [str(words[i]["word"]).strip() for i in valid]
    hits = _word_hits(texts, redactor)
    for i, kind in _word_hits([t.strip(_PUNCT) for t in texts], redactor).items():
        hits.setdefault(i, kind)
    if not hits:
        return [], list(words)
    redacted = {valid[i]: kind for i, kind in hits.items()}
    spans: list[Span] = []
    out: list[Any] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            first, last = words[run[0]], words[run[-1]]
            kind = redacted[run[0]]
            start, end = float(first["start"]), float(last["end"])
            spans.append(Span(round(max(0.0, start - pad_s), 3), round(end + pad_s, 3), kind))
            out.append({"word": f"[{kind}]", "start": start, "end": end})
            run.clear()

    for i, w in enumerate(words):
        if i in redacted and (not run or redacted[run[0]] == redacted[i]):
            run.append(i)
            continue
        flush()
        if i in redacted:
            run.append(i)
        else:
            out.append(w)
    flush()
    return spans, out


def agent_spans(
    events: list[dict[str, Any]], redacted: list[dict[str, Any]], frame_s: float, pad_s: float = PAD_S,
    tail_s: float = AGENT_TAIL_S,
) -> list[Span]:
    """Wav-time spans of the agent's redacted tokens: `events` and `redacted` are a call's event log before
    and after `redact_frames` (same positions); a run of `frame` events whose text changed is one span (a new
    `[kind]` label starts another), from its first frame's `t` - `pad_s` to its last frame's end + `tail_s`."""
    spans: list[Span] = []
    run: list[tuple[float, str]] = []

    def flush() -> None:
        if run:
            first, last = run[0][0], run[-1][0]
            spans.append(Span(round(max(0.0, first - pad_s), 3), round(last + frame_s + tail_s, 3), run[0][1]))
            run.clear()

    for before, after in zip(events, redacted, strict=True):
        if before.get("type") != "frame" or not before.get("text"):
            continue
        if after.get("text") == before["text"] or not isinstance(before.get("t"), (int, float)):
            flush()
            continue
        label = _LABEL.search(str(after.get("text") or ""))
        if label and run:
            flush()
        run.append((float(before["t"]), label[1] if label else (run[0][1] if run else "redacted")))
    flush()
    return spans


def zero_channel(fd: int, ranges: Iterable[tuple[int, int]], channel: int) -> int:
    """Zero one channel (0 caller, 1 agent) of the open 16-bit stereo wav `fd` over sample ranges [a, b);
    how many samples were zeroed."""
    zeroed = 0
    for a, b in ranges:
        if b <= a:
            continue
        offset = WAV_HEADER + a * 4  # 4 bytes a sample pair
        block = os.pread(fd, (b - a) * 4, offset)
        pcm = np.frombuffer(block, dtype="<i2").reshape(-1, 2).copy()
        pcm[:, channel] = 0
        os.pwrite(fd, pcm.tobytes(), offset)
        zeroed += len(pcm)
    return zeroed


class CallerTimeline:
    """Which caller-stream frame each wav frame holds (-1: none, the tick was concealed)."""

    def __init__(self, frame_s: float) -> None:
        self.frame_s = frame_s
        self._of = array("q")

    def add(self, caller_frame: int) -> None:
        self._of.append(caller_frame)

    def __len__(self) -> int:
        return len(self._of)

    def cuts(self, span: Span, frame_samples: int, first: int = 0) -> list[tuple[int, int, int]]:
        """(wav frame, first sample, end sample) of the caller audio inside `span`, from wav frame `first` on."""
        of = np.frombuffer(self._of, dtype=np.int64)[first:] if len(self._of) else np.zeros(0, np.int64)
        lo = int(np.floor(span.start / self.frame_s))
        hi = int(np.ceil(span.end / self.frame_s))
        out = []
        for j in np.flatnonzero((of >= lo) & (of < hi)):
            k = int(of[j])
            a = max(0.0, span.start - k * self.frame_s) / self.frame_s
            b = min(self.frame_s, span.end - k * self.frame_s) / self.frame_s
            s0, s1 = int(np.floor(a * frame_samples)), int(np.ceil(b * frame_samples))
            if s1 > s0:
                out.append((first + int(j), s0, min(frame_samples, s1)))
        return out


__all__ = ["AGENT_TAIL_S", "PAD_S", "CallerTimeline", "Span", "agent_spans", "redacted_words", "zero_channel"]
