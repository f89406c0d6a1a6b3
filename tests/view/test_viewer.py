"""`duetaspan view`: a real recorded call (tiny-random agent, scripted caller, router and ASR on loopback)
rendered as one self-contained page; what the page carries (retrievals with their stages, redacted arguments,
outcomes, utterances, waveforms, playable audio); escaping; a synthetic record for the rarer events; and
real headless Chromium drawing it (screenshot not blank, audio playable)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.view import ViewError, build_view, render_call
from tests.adapters.webrtc.browser import CHROMIUM, Chromium
from tests.support import REPO_ROOT
from tests.view.recorded import CALL_ID, HEARD, record_call

# records a real-time call whose turns must land in order: it needs the CPU quiet (the suite's serial lane)
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.serial]
EVIL = "</script><script>window.pwned = 1</script>"
# the audio element's duration once it has loaded (-1 when the browser cannot play it)
PLAYABLE = (
    "new Promise(r => { const a = document.getElementById('audio');"
    " if (a.readyState >= 1) r(a.duration); else a.onloadedmetadata = () => r(a.duration);"
    " a.onerror = () => r(-1); })"
)
DATA = re.compile(r'<script id="call-data" type="application/json">(.*?)</script>', re.S)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """One real call for the whole module (its `.json`, `.jsonl` and `.wav` in a fresh folder)."""
    return asyncio.run(record_call(tmp_path_factory.mktemp("calls")))


def page_data(page: str) -> dict:
    match = DATA.search(page)
    assert match, "the page carries no call data"
    return json.loads(match.group(1))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "duetaspan", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_view_command_renders_a_recorded_call_into_one_offline_page(recorded, tmp_path):
    out = tmp_path / "call.html"
    done = run_cli("view", str(recorded), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert f"call viewer: {out}" in done.stdout
    page = out.read_text()

    # self-contained: no external script, style, font or media; a CSP forbids the network anyway
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page and "default-src 'none'" in page
    data = page_data(page)
    assert data["call"]["call_id"] == CALL_ID and data["call"]["complete"]
    assert data["counts"]["rets"] == 2 and data["counts"]["landed"] == 1 and data["counts"]["none"] == 1

    asked, declined = data["retrievals"]
    assert asked["tool"] == "get_time" and asked["arguments"] == {"place": "Tokyo"}
    assert asked["outcome"] == "landed" and "Tokyo" in asked["reference"]
    assert asked["question"] == HEARD[0] and asked["span"]["t"] > asked["t"]
    for stage in ("capture", "asr", "router", "tool", "prefill", "total"):
        assert isinstance(asked["stages"][stage], float), (stage, asked["stages"])
    assert asked["stages"]["total"] >= asked["stages"]["capture"]
    assert declined["outcome"] == "none" and declined["reason"] and declined["question"] == HEARD[1]
    assert [s["retrieval"] for s in data["spans"]] == [1]
    assert [u["text"] for u in data["utterances"]] == HEARD
    assert data["phrases"] and all(p["t1"] > p["t0"] for p in data["phrases"])
    record = json.loads(recorded.read_text())
    assert data["counts"]["concealed_frames"] == sum(1 for f in record["frames"] if f["concealed"])

    # waveforms: one byte per 20 ms per channel over the whole wav; the caller spoke, the agent made sound
    duration = data["call"]["duration_s"]
    caller = np.frombuffer(base64.b64decode(data["peaks"]["caller"]), np.uint8)
    agent = np.frombuffer(base64.b64decode(data["peaks"]["agent"]), np.uint8)
    assert data["peaks"]["rate"] == 50 and abs(caller.size - duration * 50) <= 2 and agent.size == caller.size
    assert caller.max() > 100 and agent.max() > 0

    # the audio: Ogg/Opus in a data URI, stereo, as long as the call, a few KB a second
    src = re.search(r'<audio id="audio"[^>]* src="data:audio/ogg;base64,([^"]+)"', page)
    assert src, "no embedded audio"
    ogg = base64.b64decode(src.group(1))
    assert ogg[:4] == b"OggS"
    pcm, rate = soundfile.read(io.BytesIO(ogg))
    assert pcm.shape[1] == 2 and abs(pcm.shape[0] / rate - duration) < 0.1
    assert len(page) < 60_000 + 8_000 * duration, f"{len(page)} bytes for {duration} s"


def test_view_links_or_leaves_out_audio_and_works_without_a_wav(recorded, tmp_path):
    linked = recorded.with_name("linked.html")
    done = run_cli("view", str(recorded), "-o", str(linked), "--audio", "link")
    assert done.returncode == 0, done.stderr
    assert f'src="{recorded.with_suffix(".wav").name}"' in linked.read_text()
    silent = render_call(recorded, tmp_path / "none.html", audio="none").read_text()
    assert '<audio id="audio"' not in silent and page_data(silent)["peaks"]["caller"]

    alone = tmp_path / "alone"
    alone.mkdir()
    (alone / "CA1.json").write_text(recorded.read_text())
    page = render_call(alone / "CA1.json").read_text()  # default output: next to the record
    assert (alone / "CA1.html").is_file() and "<audio" not in page and page_data(page)["peaks"] is None
    assert "the wav is not next to the record" in page


def test_view_refuses_what_is_not_a_call_record(tmp_path):
    done = run_cli("view", str(tmp_path / "missing.json"))
    assert done.returncode == 1 and "no call record at" in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "x.json").write_text('{"hello": 1}')
    with pytest.raises(ViewError, match="not a duetaspan call record"):
        render_call(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(ViewError, match="not a JSON call record"):
        render_call(tmp_path / "y.json")


def synthetic_record(folder: Path) -> Path:
    """A call written through the real recorder with the rarer events: a late span, a router error, a call
    ending mid-retrieval, a deduplicated `<ret>`, a console span, a barge-in, concealed runs, an engine
    error, and text that tries to break out of the page. Left without `.json` (as after a crash)."""
    rec = CallRecorder(folder, "CA-syn", meta={"transport": "twilio", "caller": "+1555"}, audio=False)
    evil = EVIL
    for i in range(100):
        rec.event("frame", i=i, t=round(i * 0.08, 3), text=" hi" if i in (3, 4, 40) else "",
                  ret=False, silent=False, concealed=i in (10, 11, 12, 50), step_ms=5.0, lateness_ms=0.1)  # fmt: skip

    def ev(kind, rid, frame, at_ms, **fields):
        rec.event("retrieval", kind=kind, call_id="CA-syn", retrieval_id=rid, frame_index=frame, at_ms=at_ms,
                  **fields)  # fmt: skip

    rec.event("caller_utterance", kind="caller_utterance", text=evil, start=0.5, end=1.5, asr_ms=3.0, t=0.5)
    rec.event(
        "caller_utterance", kind="caller_utterance", text="{{JS}} {{DATA}}", start=2, end=3, asr_ms=3.0, t=2
    )
    for rid, frame in ((1, 20), (2, 40), (3, 60)):
        rec.event("ret", frame_index=frame, t=frame * 0.08)
        ev("ret", rid, frame, 0.0, t=frame * 0.08, deduplicated=False)
        ev("question", rid, frame, 300.0, text=f"q{rid}", how="final", asr_ms=50.0, wait_ms=0.0, audio_s=1.0)
    ev("ret", 0, 21, 0.0, t=1.68, deduplicated=True)
    ev("router", 1, 20, 900.0, decision="tool", llm_ms=600.0, attempts=1, tool="pay", detail=None)
    ev(
        "tool",
        1,
        20,
        2600.0,
        tool="pay",
        arguments={"card": "[redacted]", "amount": 5},
        ok=True,
        tool_ms=1700.0,
    )
    rec.event("late_span", kind="late", call_id="CA-syn", retrieval_id=1, frame_index=20, at_ms=2500.0,
              stage="tool", deadline_s=2.5, reference=None)  # fmt: skip
    ev("error", 2, 40, 400.0, stage="router", error="LLM down")
    ev("cancelled", 3, 60, 350.0, stage="router")
    rec.event("span", reference=f"(tool result) {evil}", frame_index=80, t=6.4, n_frames=9, prefill_ms=3.0,
              question=None, tool="get_time", arguments={"place": "Oslo"}, latency_ms=None)  # fmt: skip
    rec.event("barge_in", frame_index=70, t=5.6, spoke_frames=12)
    rec.event("error", stage="engine", message="step failed")
    rec.event("ret", frame_index=90, t=7.2)  # delivered, then the call ended before the span landed
    ev("ret", 4, 90, 0.0, t=7.2, deduplicated=False)
    ev("delivered", 4, 90, 900.0, reference="(tool result) 3 PM", total_ms=900.0)
    rec.event("span_dropped", span_id=2, retrieval_id=4, reference="(tool result) 3 PM", queued_ms=41.5,
              reason="the call ended before the span landed")  # fmt: skip
    return rec.jsonl_path


def test_build_view_covers_late_failed_cancelled_console_spans_and_barge_ins(tmp_path):
    jsonl = synthetic_record(tmp_path)
    page = render_call(jsonl, tmp_path / "syn.html").read_text()
    assert "</script><script>window.pwned" not in page  # the record cannot close the data tag
    view = page_data(page)
    assert view["call"]["complete"] is False and view["call"]["transport"] == "twilio"
    assert [u["text"] for u in view["utterances"]] == [
        EVIL,
        "{{JS}} {{DATA}}",
    ]  # the template's words stay text
    late, failed, cancelled, dropped = view["retrievals"]
    assert dropped["outcome"] == "delivered" and dropped["span"] is None and "41.5 ms" in dropped["reason"]
    assert late["outcome"] == "late" and "2.5" in late["reason"] and late["arguments"]["card"] == "[redacted]"
    assert late["stages"] == {"capture": 300.0, "asr": 50.0, "wait": 0.0, "router": 600.0, "tool": 1700.0}
    assert failed["outcome"] == "error" and "LLM down" in failed["reason"]
    assert cancelled["outcome"] == "cancelled"
    assert view["deduplicated"] == [{"t": 1.68, "frame_index": 21}]
    (console,) = view["spans"]
    assert console["retrieval"] is None and console["tool"] == "get_time"
    assert console["reference"].endswith("window.pwned = 1</script>")  # shown as text, intact
    assert view["barge_ins"] == [{"t": 5.6, "spoke_s": 0.96}]
    assert view["concealed"] == [[0.8, 1.04], [4.0, 4.08]] and view["counts"]["concealed_frames"] == 4
    assert view["errors"] == [{"t": None, "stage": "engine", "message": "step failed"}]
    assert [p["text"] for p in view["phrases"]] == ["hi hi", "hi"]
    assert build_view({"frames": []})["counts"]["rets"] == 0  # an empty record still renders


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/test.sh installs it)")
async def test_viewer_draws_in_chromium_with_playable_audio(recorded, tmp_path):
    from PIL import Image, ImageStat

    html = render_call(recorded, tmp_path / "call.html")
    linked = render_call(recorded, recorded.with_name("linked-browser.html"), audio="link")
    syn = render_call(synthetic_record(tmp_path), tmp_path / "syn.html")
    analysed = tmp_path / "analysed.json"  # the record once its end-of-call analysis is in (update_record)
    analysed.write_text(json.dumps({**json.loads(recorded.read_text()), "analysis": ANALYSIS}))
    analysed = render_call(analysed, tmp_path / "analysed.html", audio="none")
    async with Chromium.launch(html.as_uri(), tmp_path / "chromium", size="1280,1000") as page:
        drawn = await page.wait_for("window.__view && window.__view.ready && window.__view.drawn", 20)
        duration = await page.evaluate(PLAYABLE)
        await page.evaluate("document.querySelector('.card[data-card=\"1\"]').click()")
        at = await page.evaluate("document.getElementById('audio').currentTime")
        cards = await page.evaluate(
            "[...document.querySelectorAll('#retrievals .card')].map(c => c.innerText)"
        )
        shot = await page.screenshot(tmp_path / "viewer.png")
        await page.send("Page.navigate", url=linked.as_uri())
        await page.wait_for("window.__view && window.__view.ready", 20)
        linked_duration = await page.evaluate(PLAYABLE)
        await page.send("Page.navigate", url=syn.as_uri())
        syn_drawn = await page.wait_for("window.__view && window.__view.ready && window.__view.drawn", 20)
        injected = await page.evaluate(
            "[typeof window.pwned, document.querySelector('#timeline .box.caller').textContent]"
        )
        no_analysis = await page.evaluate("document.getElementById('analysis-panel').hidden")
        await page.send("Page.navigate", url=analysed.as_uri())
        analysis_drawn = await page.wait_for("window.__view && window.__view.ready && window.__view.drawn", 20)
        analysis = await page.evaluate(
            "[document.getElementById('analysis-panel').hidden, document.getElementById('analysis').innerText,"
            " typeof window.pwned]"
        )
    record = json.loads(recorded.read_text())
    assert abs(duration - record["summary"]["frames"] * 0.08) < 0.15  # the embedded audio plays in Chromium
    assert abs(linked_duration - duration) < 0.1  # and so does the wav a linked page points at
    assert (
        drawn["waves"] == 2
        and drawn["cards"] == 2
        and drawn["utterances"] == len(record["caller_utterances"])
    )
    assert drawn["markers"] == 4  # R1, its landed span, R2 and its no-span
    assert abs(at - record["rets"][0]["t"]) < 0.1  # a card click seeks the audio to its <ret>
    assert "get_time" in cards[0] and '{"place":"Tokyo"}' in cards[0] and "landed at" in cards[0]
    assert "no span" in cards[1]

    image = Image.open(shot).convert("RGB")
    assert image.size[0] == 1280 and image.size[1] > 600
    colours = image.getcolors(1 << 20) or []
    assert len(colours) > 200 and max(ImageStat.Stat(image).stddev) > 20  # drawn, not blank
    saved = os.environ.get("DUETASPAN_VIEWER_SCREENSHOT")
    if saved:  # how docs/images/call-viewer.png is made (a 128-colour palette keeps it small)
        image.quantize(128).save(saved, optimize=True)

    assert syn_drawn["barge_ins"] == 1 and syn_drawn["concealed"] == 2 and syn_drawn["waves"] == 0
    assert syn_drawn["cards"] == 6  # four retrievals (one dropped at the call's end), the console span, the error
    assert injected == ["undefined", "</script><script>window.pwned = 1</script>"]
    # the analysis panel: absent before the analysis is in, then its summary, success and fields
    assert no_analysis is True and analysis_drawn["analysis"] == 5
    hidden, text, pwned = analysis
    assert hidden is False and pwned == "undefined"
    assert "The caller asked the time in Tokyo." in text and "yes" in text and "Tokyo" in text
    assert EVIL in text and '["a","b"]' in text  # a field's text is text; a list shown as JSON


def test_viewer_benchmark_runs_on_a_short_call():
    """benchmarks/viewer.py (the sizes docs/operations.md quotes) on a 12-second call."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "benchmarks/viewer.py", "--minutes", "0.2"],
        cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = done.stdout.splitlines()[-1].split()
    assert row[:2] == ["0.2", "m"] and 0 < float(row[2]) < 0.2 and row[3] == "MB", done.stdout


ANALYSIS = {"summary": "The caller asked the time in Tokyo.", "success": True,
            "fields": {"city": "Tokyo", "note": EVIL, "tags": ["a", "b"]}, "attempts": 1, "ms": 812.0}  # fmt: skip


def test_build_view_carries_the_end_of_call_analysis():
    assert build_view({"frames": [], "analysis": ANALYSIS})["analysis"] == {
        "summary": "The caller asked the time in Tokyo.", "success": True,
        "fields": {"city": "Tokyo", "note": EVIL, "tags": ["a", "b"]}, "error": None, "attempts": 1}  # fmt: skip
    failed = build_view({"frames": [], "analysis": {"error": "LLM down", "attempts": 2, "ms": 5.0}})["analysis"]
    assert failed == {"summary": None, "success": None, "fields": {}, "error": "LLM down", "attempts": 2}
    assert build_view({"frames": []})["analysis"] is None  # not made (yet), or analysis off
    assert build_view({"frames": [], "analysis": "garbage"})["analysis"] is None


def test_build_view_shows_who_answered_and_when():
    answer = {"verdict": "voicemail", "confidence": 0.8, "decided_at_s": 2.86, "source": "audio",
              "ungated_at_s": None, "outcome": "voicemail_left", "message_s": 4.18, "beep_at_s": 4.05,
              "verdicts": [{"verdict": "voicemail"}, {"verdict": "beep"}]}  # fmt: skip
    view = build_view({"frames": [], "meta": {"transport": "twilio", "answer": answer}})
    assert view["call"]["answer"] == {"verdict": "voicemail", "source": "audio", "outcome": "voicemail_left",
                                      "confidence": 0.8, "decided_at_s": 2.86, "ungated_at_s": None,
                                      "beep_at_s": 4.05, "message_s": 4.18}  # fmt: skip
    assert build_view({"frames": []})["call"]["answer"] is None
