"""What the call viewer draws, computed from a call record (the `.json` of `duetaspan.pipeline.artifacts`).

`build_view(record)` returns a JSON-ready dict: the call's header figures, the agent's words grouped into
phrases, the caller's transcribed utterances, every `<ret>` with its retrieval (question, router decision,
tool and its redacted arguments, stage latencies, reference, outcome: landed / late / none / error /
cancelled), spans that no retrieval delivered (tool console, custom backends), barge-ins, runs of concealed
frames and errors, and who answered (`call.answer`: the verdict and when it came). All times are call time in seconds (the position in the call's wav).

Arguments are shown as the record holds them: the router and the tool console record them redacted.

Example:
    >>> view = build_view({"call_id": "CA1", "frame_ms": 80.0, "frames": [], "agent_text": [
    ...     {"t": 0.08, "text": "Hello"}, {"t": 0.16, "text": " there"}]})
    >>> view["phrases"]
    [{'t0': 0.08, 't1': 0.24, 'text': 'Hello there'}]
"""

from __future__ import annotations

from typing import Any

from duetaspan.pipeline.transcript import turns

PHRASE_GAP_S = 0.6  # a pause this long in the agent's words starts a new phrase
PHRASE_MAX_S = 4.0  # ... and so does a phrase this long (boxes on the time axis stay readable)


def build_view(record: dict[str, Any]) -> dict[str, Any]:
    """The page's data for `record` (see the module docstring)."""
    frame_s = float(record.get("frame_ms") or 80.0) / 1000.0
    frames = record.get("frames") or []
    summary = record.get("summary") or {}
    n_frames = int(summary.get("frames") or len(frames))
    retrievals, deduplicated = _retrievals(record, frame_s)
    spans = _spans(record, retrievals)
    by_frame = {r["frame_index"]: r["id"] for r in retrievals}
    rets = [
        {
            "t": _num(r.get("t")),
            "frame_index": r.get("frame_index"),
            "retrieval": by_frame.get(r.get("frame_index")),
        }
        for r in record.get("rets") or []
    ]
    concealed = _runs([f for f in frames if f.get("concealed")], frame_s)
    meta = record.get("meta") or {}
    outcomes = [r["outcome"] for r in retrievals]
    return {
        "call": {
            "call_id": record.get("call_id"),
            "transport": meta.get("transport"),
            "caller": meta.get("caller"),
            "called": meta.get("called"),
            "started_at": record.get("started_at"),
            "ended_at": record.get("ended_at"),
            "complete": bool(record.get("complete")),
            "ended_by": summary.get("ended_by"),
            "frames": n_frames,
            "frame_s": frame_s,
            "duration_s": round(n_frames * frame_s, 3),
            "clock": summary.get("clock") or {},
            "answer": _answer(meta.get("answer")),
        },
        "analysis": _analysis(record.get("analysis")),
        "counts": {
            "rets": len(rets),
            "retrievals": len(retrievals),
            "landed": outcomes.count("landed"),
            "late": outcomes.count("late"),
            "none": outcomes.count("none"),
            "failed": outcomes.count("error") + outcomes.count("cancelled"),
            "spans": len(spans),
            "persona_pins": len(record.get("persona_pins") or []),
            "barge_ins": len(record.get("barge_ins") or []),
            "concealed_frames": sum(1 for f in frames if f.get("concealed")),
            "errors": len(record.get("errors") or []),
        },
        "persona_pins": [
            {"t": _num(p.get("t")), "n_frames": p.get("n_frames"), "prefill_ms": _num(p.get("prefill_ms"))}
            for p in record.get("persona_pins") or []
        ],
        "phrases": _phrases(record.get("agent_text") or [], frame_s),
        # the record's one two-sided transcript (rebuilt for records written before it existed)
        "turns": record.get("turns") or turns(record.get("agent_text") or [], record.get("caller_utterances") or []),
        "utterances": [
            {
                "t0": _num(u.get("start", u.get("t"))),
                "t1": _num(u.get("end", u.get("t"))),
                "text": str(u.get("text") or ""),
                "asr_ms": _num(u.get("asr_ms")),
            }
            for u in record.get("caller_utterances") or []
        ],
        "rets": rets,
        "retrievals": retrievals,
        "deduplicated": deduplicated,
        "spans": spans,
        "barge_ins": [
            {"t": _num(b.get("t")), "spoke_s": round(int(b.get("spoke_frames") or 0) * frame_s, 2)}
            for b in record.get("barge_ins") or []
        ],
        "concealed": concealed,
        "errors": [
            {"t": _num(e.get("t")), "stage": e.get("stage"), "message": str(e.get("message") or "")}
            for e in record.get("errors") or []
        ],
    }


def _answer(answer: Any) -> dict[str, Any] | None:
    """Who answered (`duetaspan.outbound`, the record's `meta.answer`): the verdict and when it came."""
    if not isinstance(answer, dict) or not answer.get("verdict"):
        return None
    keep = ("verdict", "source", "outcome")
    times = ("confidence", "decided_at_s", "ungated_at_s", "beep_at_s", "message_s")
    return {k: answer.get(k) for k in keep} | {k: _num(answer.get(k)) for k in times}


def _analysis(analysis: Any) -> dict[str, Any] | None:
    """The end-of-call analysis (`duetaspan.webhooks.analysis`, the record's `analysis`, written after the call):
    its summary, success answer and fields, or its error; None before it is made or where it is off."""
    if not isinstance(analysis, dict):
        return None
    fields = analysis.get("fields")
    return {
        "summary": str(analysis["summary"]) if analysis.get("summary") is not None else None,
        "success": analysis.get("success") if isinstance(analysis.get("success"), bool) else None,
        "fields": fields if isinstance(fields, dict) else {},
        "error": str(analysis["error"]) if analysis.get("error") else None,
        "attempts": analysis.get("attempts") if isinstance(analysis.get("attempts"), int) else None,
    }


def _num(value: Any) -> float | None:
    return round(float(value), 3) if isinstance(value, int | float) else None


def _phrases(words: list[dict[str, Any]], frame_s: float) -> list[dict[str, Any]]:
    phrases: list[dict[str, Any]] = []
    for w in words:
        t = float(w.get("t") or 0.0)
        text = str(w.get("text") or "")
        if phrases and t - phrases[-1]["t1"] < PHRASE_GAP_S and t - phrases[-1]["t0"] < PHRASE_MAX_S:
            phrases[-1]["text"] += text
            phrases[-1]["t1"] = round(t + frame_s, 3)
        else:
            phrases.append({"t0": round(t, 3), "t1": round(t + frame_s, 3), "text": text})
    for p in phrases:
        p["text"] = p["text"].strip()
    return [p for p in phrases if p["text"]]


def _runs(frames: list[dict[str, Any]], frame_s: float) -> list[list[float]]:
    """Consecutive frames (by index) merged into `[t0, t1]` runs."""
    runs: list[list[float]] = []
    last = None
    for f in frames:
        i = int(f.get("i", 0))
        t = float(f.get("t", i * frame_s))
        if runs and last is not None and i == last + 1:
            runs[-1][1] = round(t + frame_s, 3)
        else:
            runs.append([round(t, 3), round(t + frame_s, 3)])
        last = i
    return runs


def _retrievals(record: dict[str, Any], frame_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Retrieval events (from `retrieval_events`, `no_spans`, `late_spans`) grouped per retrieval id."""
    events = [
        e
        for key in ("retrieval_events", "no_spans", "late_spans")
        for e in record.get(key) or []
        if isinstance(e, dict) and "retrieval_id" in e
    ]
    events.sort(key=lambda e: (e.get("retrieval_id", 0), e.get("at_ms") or 0.0))
    groups: dict[int, list[dict[str, Any]]] = {}
    deduplicated = []
    for e in events:
        rid = int(e.get("retrieval_id") or 0)
        if rid == 0 or e.get("deduplicated"):
            deduplicated.append({"t": _num(e.get("t")), "frame_index": e.get("frame_index")})
            continue
        groups.setdefault(rid, []).append(e)
    return [_retrieval(rid, evs, frame_s) for rid, evs in sorted(groups.items())], deduplicated


def _retrieval(rid: int, events: list[dict[str, Any]], frame_s: float) -> dict[str, Any]:
    frame_index = int(events[0].get("frame_index") or 0)
    r: dict[str, Any] = {
        "id": rid,
        "frame_index": frame_index,
        "t": round(frame_index * frame_s, 3),
        "question": None,
        "how": None,
        "decision": None,
        "detail": None,
        "tool": None,
        "arguments": None,
        "tool_ok": None,
        "tool_error": None,
        "reference": None,
        "source": None,
        "outcome": "pending",
        "reason": None,
        "stages": {},
        "span": None,
        "ended_ms": _num(max(float(e.get("at_ms") or 0.0) for e in events)),
    }
    stages = r["stages"]
    for e in events:
        kind = e.get("kind")
        if kind == "ret" and isinstance(e.get("t"), int | float) and e["t"] >= 0:
            r["t"] = _num(e["t"])
        elif kind == "question":
            r["question"], r["how"] = e.get("text"), e.get("how")
            stages["capture"] = _num(e.get("at_ms"))
            stages["asr"] = _num(e.get("asr_ms"))
            stages["wait"] = _num(e.get("wait_ms"))
        elif kind == "router":
            r["decision"], r["detail"] = e.get("decision"), e.get("detail")
            r["tool"] = r["tool"] or e.get("tool")
            stages["router"] = _num(e.get("llm_ms"))
        elif kind == "tool":
            r["tool"], r["arguments"] = e.get("tool"), e.get("arguments")
            r["tool_ok"], r["tool_error"] = e.get("ok"), e.get("error")
            stages["tool"] = _num(e.get("tool_ms"))
        elif kind == "reference":
            r["reference"], r["source"] = e.get("reference"), e.get("source")
        elif kind == "delivered":
            r["reference"] = e.get("reference") or r["reference"]
            r["outcome"] = "delivered"
            stages["delivered"] = _num(e.get("total_ms"))
        elif kind == "late":
            r["outcome"], r["reason"] = "late", f"deadline {e.get('deadline_s')} s passed in {e.get('stage')}"
            r["reference"] = e.get("reference") or r["reference"]
        elif kind == "no_span":
            r["outcome"], r["reason"] = "none", e.get("reason")
        elif kind == "error":
            r["outcome"], r["reason"] = "error", f"{e.get('stage')}: {e.get('error')}"
        elif kind == "cancelled":
            r["outcome"], r["reason"] = "cancelled", f"call ended during {e.get('stage')}"
    return r


def _spans(record: dict[str, Any], retrievals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every landed span, linked to the retrieval that delivered it: by the `retrieval_id` the record carries
    (records before it had one: the same reference, after its `<ret>`)."""
    out = []
    waiting = [r for r in retrievals if r["outcome"] == "delivered"]
    for s in record.get("spans") or []:
        t = float(s.get("t") or 0.0)
        span = {
            "t": _num(t),
            "reference": str(s.get("reference") or ""),
            "tool": s.get("tool"),
            "arguments": s.get("arguments"),
            "question": s.get("question"),
            "n_frames": s.get("n_frames"),
            "prefill_ms": _num(s.get("prefill_ms")),
            "latency_ms": _num(s.get("latency_ms")),
            "retrieval": None,
        }
        if s.get("retrieval_id") is not None:
            match = next((r for r in waiting if r["id"] == s["retrieval_id"]), None)
        else:
            match = next((r for r in waiting if r["reference"] == span["reference"] and r["t"] <= t), None)
        if match is not None:
            waiting.remove(match)
            span["retrieval"] = match["id"]
            match["outcome"], match["span"] = "landed", {"t": span["t"], "n_frames": span["n_frames"]}
            match["stages"]["prefill"] = span["prefill_ms"]
            match["stages"]["total"] = (
                span["latency_ms"] if span["latency_ms"] is not None else round((t - match["t"]) * 1000, 1)
            )
        out.append(span)
    for dropped in record.get("dropped_spans") or []:  # queued, but the call ended before it landed
        match = next((r for r in waiting if r["id"] == dropped.get("retrieval_id")), None)
        if match is not None:
            match["reason"] = f"the call ended {_num(dropped.get('queued_ms'))} ms after the span was queued"
    return out
