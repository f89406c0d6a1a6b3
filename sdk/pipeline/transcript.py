"""The call's one two-sided transcript: `turns`, an ordered list of `{"who", "text", "start", "end"}`.

`who` is `"agent"` (the model's words, from the text pieces of its frames: a pause of `TURN_GAP_S` or more
starts a new turn) or `"caller"` (each transcribed utterance, when an ASR ran: the router's question capture
transcribes what the caller says). `start` / `end` are call seconds (the position in the wav); turns are
ordered by `start`, the agent first on a tie. The record's `turns` is what end-of-call analysis reads, what
redaction rewrites, what the `call.ended` webhook carries and what the viewer's transcript shows; the older
`transcript` (the agent's words as one string) and `caller_utterances` stay beside it.

Example:
    >>> turns([{"t": 0.0, "text": " Hi,"}, {"t": 0.08, "text": " how can I help?"}],
    ...       [{"text": "what time is it", "start": 1.5, "end": 2.4}])
    [{'who': 'agent', 'text': 'Hi, how can I help?', 'start': 0.0, 'end': 0.16}, {'who': 'caller', 'text': 'what time is it', 'start': 1.5, 'end': 2.4}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from duetaspan.model.convention import FRAME_MS

TURN_GAP_S = 1.0  # this long without an agent word ends the agent's turn
FRAME_S = FRAME_MS / 1000.0


def agent_turns(words: Iterable[Mapping[str, Any]], *, frame_s: float = FRAME_S) -> list[dict[str, Any]]:
    """The agent's turns from its text pieces (`{"t", "text"}` per frame with text, in order)."""
    out: list[dict[str, Any]] = []
    for w in words:
        t = float(w.get("t") or 0.0)
        text = str(w.get("text") or "")
        if out and t - out[-1]["end"] < TURN_GAP_S:
            out[-1]["text"] += text
            out[-1]["end"] = round(t + frame_s, 3)
        else:
            out.append({"who": "agent", "text": text, "start": round(t, 3), "end": round(t + frame_s, 3)})
    for turn in out:
        turn["text"] = " ".join(turn["text"].split())
    return [turn for turn in out if turn["text"]]


def caller_turns(utterances: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The caller's turns: one per transcribed utterance that has words."""
    out = []
    for u in utterances:
        text = " ".join(str(u.get("text") or "").split())
        if not text:
            continue
        start = float(u.get("start", u.get("t")) or 0.0)
        end = float(u.get("end", start) or start)
        out.append({"who": "caller", "text": text, "start": round(start, 3), "end": round(end, 3)})
    return out


def turns(
    agent_words: Iterable[Mapping[str, Any]], utterances: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Both sides, ordered by start time (the agent first when a caller turn starts at the same moment)."""
    both = agent_turns(agent_words) + caller_turns(utterances)
    return sorted(both, key=lambda turn: (turn["start"], turn["who"] != "agent"))


def as_text(call_turns: Iterable[Mapping[str, Any]]) -> str:
    """The turns as lines a person (or an LLM) reads: `[12.3s] caller: ...`."""
    return "\n".join(f"[{float(t['start']):.1f}s] {t['who']}: {t['text']}" for t in call_turns)


__all__ = ["TURN_GAP_S", "agent_turns", "as_text", "caller_turns", "turns"]
