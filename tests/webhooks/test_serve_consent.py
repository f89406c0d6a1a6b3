"""Recording consent in a real `duetaspan serve --twilio` process (a Twilio-protocol WebSocket call with real
mu-law audio): with `[recording] consent = "ask"` the first audio the caller hears is the notice (a 440 Hz
tone here, found in the mu-law the server sent), and the caller's refusal by DTMF deletes the recording written
since the first frame: no wav on disk, the record says `consent_refused`, and `call.ended` at a real receiver
says `recorded: false`; and the same refusal by an RFC 4733 digit on a SIP call through `serve --sip` on
PostgreSQL. tests/webhooks/test_consent.py covers the rest of consent in-process."""

from __future__ import annotations

import asyncio
import audioop
import base64
import json
import time

import numpy as np
import soundfile

from tests.adapters.sip.peer import caller_stream, needs_sipp, run_sipp, scenario, sip_e2e, wait_for
from tests.adapters.sip.test_serve_sip import serve_sip
from tests.adapters.twilio.peer import TwilioPeer, renumber
from tests.support import load_twilio_stream, load_ulaw, wait_until_healthy, worker_sip_toml
from tests.webhooks.conftest import SECRET, Receiver
from tests.webhooks.test_serve_webhooks import _serve

RATE = 24_000


def _toml(hook: str) -> str:
    return f"""
[persona]
prompt = "You answer the phone for a test."
[recording]
consent = "ask"
consent_audio = "notice.wav"
consent_refuse_digits = "9"
consent_window_s = 30
[webhooks]
urls = ["{hook}"]
timeout_s = 3
max_backoff_s = 1
[server]
data_dir = "data"
"""


def _tone_share(chunks: list[bytes], hz: float = 440.0) -> float:
    """How much of the decoded audio's energy lies within 20 Hz of `hz` (1.0: a pure tone)."""
    pcm = np.frombuffer(audioop.ulaw2lin(b"".join(chunks), 2), np.int16).astype(np.float64)
    spectrum = np.abs(np.fft.rfft(pcm * np.hanning(len(pcm)))) ** 2
    freqs = np.fft.rfftfreq(len(pcm), 1 / 8000)
    return float(spectrum[np.abs(freqs - hz) < 20].sum() / max(spectrum.sum(), 1e-9))


async def test_a_caller_who_refuses_by_dtmf_is_not_recorded(tmp_path):
    t = np.arange(int(RATE * 0.8)) / RATE
    soundfile.write(tmp_path / "notice.wav", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), RATE,
                    subtype="FLOAT")  # fmt: skip
    receiver = Receiver()
    hook = await receiver.start()
    (tmp_path / "agent.toml").write_text(_toml(hook))
    log = tmp_path / "serve.log"
    calls = tmp_path / "calls"
    try:
        with _serve(tmp_path, retrieval=False) as (base, proc):  # (its environment has the signing secret)
            await wait_until_healthy(base, proc, log, what="serve")
            peer = TwilioPeer(base)
            url = await peer.stream_url("CA-refuses")
            messages = renumber(load_twilio_stream("time_tokyo"), "CA-refuses")
            sid = next(m for m in messages if m["event"] == "start")["streamSid"]
            media = [i for i, m in enumerate(messages) if m["event"] == "media"]
            # the caller presses 9 two seconds in (after the notice), then goes on talking
            press = {"event": "dtmf", "streamSid": sid, "dtmf": {"track": "inbound_track", "digit": "9"}}
            messages.insert(media[100], press)
            async with peer.open_stream(url) as ws:
                got = await peer.play(ws, messages, linger_s=0.3)
            deadline = time.monotonic() + 60
            while "call.ended" not in [g["event"]["type"] for g in receiver.got]:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, f"no call.ended:\n{log.read_text()[-3000:]}"
                await asyncio.sleep(0.1)
    finally:
        await receiver.stop()
    out = [base64.b64decode(m["media"]["payload"]) for m in got.of("media")]
    assert len(out) >= 40, len(out)
    assert _tone_share(out[:40]) > 0.8  # the first 0.8 s the caller heard: the notice's tone
    record = json.loads((calls / "CA-refuses.json").read_text())
    assert record["recording"] == {"recorded": False, "reason": "consent_refused"}
    assert not list(calls.glob("*.wav"))  # written from the first frame, deleted at the refusal
    (ended,) = [g["event"] for g in receiver.got if g["event"]["type"] == "call.ended"]
    assert ended["call_id"] == "CA-refuses" and ended["data"]["recorded"] is False


@needs_sipp
@sip_e2e
async def test_a_sip_caller_who_refuses_by_rfc_4733_is_not_recorded_on_postgresql(tmp_path, pg_url):
    """The same refusal on a SIP call (SIPp streams the recorded question as RTP, then presses 1 as an RFC 4733
    event) through `serve --sip` on PostgreSQL: the wav written since the first frame is deleted, the record
    says `consent_refused`, `call.ended` says `recorded: false`."""
    t = np.arange(int(RATE * 0.8)) / RATE
    soundfile.write(tmp_path / "notice.wav", (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), RATE,
                    subtype="FLOAT")  # fmt: skip
    ulaw = load_ulaw("time_tokyo")
    pcap, talk_ms = caller_stream(tmp_path, ulaw, 0)  # the question, then 1 on the keypad (RFC 4733)
    path = scenario("caller_audio", tmp_path, PT=0, CODEC="PCMU", PCAP=pcap, TALK_MS=talk_ms + 500)
    receiver = Receiver()
    hook = await receiver.start()
    (tmp_path / "agent.toml").write_text(
        f"[sip]\n{worker_sip_toml()}[recording]\nconsent = \"ask\"\nconsent_audio = \"notice.wav\"\n"
        f'consent_refuse_digits = "1"\nconsent_window_s = 30\n[webhooks]\nurls = ["{hook}"]\ntimeout_s = 3\n'
        "max_backoff_s = 1\n"
    )
    env = {"DUETASPAN_WEBHOOK_SECRET": SECRET, "DUETASPAN_STORE_URL": pg_url}
    calls = tmp_path / "calls"
    try:
        flags = ("--max-calls", "1", "--config", str(tmp_path / "agent.toml"))
        async with serve_sip(tmp_path, *flags, env=env) as (_base, sip_port, proc):
            got = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf", str(path), "-m", "1")
            assert got.rc == 0, got.output + got.errors
            types = lambda: [g["event"]["type"] for g in receiver.got]  # noqa: E731
            await wait_for(lambda: "call.ended" in types(), timeout_s=60, what="call.ended at the receiver")
            assert proc.poll() is None
    finally:
        await receiver.stop()
    (ended,) = [g["event"] for g in receiver.got if g["event"]["type"] == "call.ended"]
    (record_path,) = calls.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["recording"] == {"recorded": False, "reason": "consent_refused"}
    assert record["meta"]["transport"] == "sip" and not list(calls.glob("*.wav"))
    assert ended["data"]["recorded"] is False and ended["data"]["transport"] == "sip"
