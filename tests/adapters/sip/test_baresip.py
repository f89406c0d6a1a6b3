"""baresip, a real softphone, dials the agent (`tiny-random`, in process): its `aufile` module plays a
fixture as the microphone, its `sndfile` module writes what it hears. The agent's audio must reach it
through at least 80 % of the call, the caller's speech must reach the agent's record, and the record's
`rtp` figures must count baresip's packets (loss fraction between 0 and 1, jitter, RTT). Gap statistics
belong in benchmarks/sip.py, not here."""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path

import numpy as np
import pytest
import soxr

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from tests.adapters.sip.peer import (
    BARESIP,
    endpoint_on_loopback,
    free_udp_port,
    needs_baresip,
    sip_e2e,
    wait_for,
)
from tests.support import load_wav

pytestmark = [needs_baresip, sip_e2e, pytest.mark.slow]

CONFIG = """poll_method epoll
sip_listen 127.0.0.1:{sip_port}
sip_trans_def udp
audio_source aufile,{wav}
audio_player aufile,/dev/null
audio_alert aufile,/dev/null
ausrc_srate 8000
auplay_srate 8000
ausrc_channels 1
auplay_channels 1
rtp_ports {rtp}-{rtp_end}
module_path /usr/lib/baresip/modules
module stdio.so
module g711.so
module aufile.so
module sndfile.so
module_app account.so
module_app menu.so
snd_path {snd}
"""


def softphone_config(folder: Path, fixture: str, pad_s: float) -> Path:
    """A baresip config folder whose microphone is `fixture` (8 kHz mono) followed by `pad_s` of silence;
    baresip hangs up when the file ends."""
    pcm, rate = load_wav(fixture)
    pcm = np.concatenate([soxr.resample(pcm, rate, 8000), np.zeros(int(pad_s * 8000), np.float32)])
    wav = folder / "mic.wav"
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.clip(np.rint(pcm * 32767), -32768, 32767).astype("<i2").tobytes())
    conf, snd = folder / "baresip", folder / "heard"
    conf.mkdir()
    snd.mkdir()
    rtp = free_udp_port() // 2 * 2
    (conf / "config").write_text(
        CONFIG.format(sip_port=free_udp_port(), wav=wav, rtp=rtp, rtp_end=rtp + 20, snd=snd)
    )
    (conf / "accounts").write_text("<sip:tester@127.0.0.1>;regint=0\n")
    return conf


def _read(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768


async def test_baresip_hears_the_agent_through_the_call(tmp_path):
    assert BARESIP is not None
    conf = softphone_config(tmp_path, "time_tokyo", pad_s=2.0)
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=1)
    async with agent, endpoint_on_loopback(agent_call_handler(agent), max_calls=1) as ep:
        proc = await asyncio.create_subprocess_exec(
            BARESIP, "-f", str(conf), "-e", f"/dial sip:agent@127.0.0.1:{ep.port}", "-t", "30",
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
        await wait_for(lambda: len(ep.finished) == 1, timeout_s=30, what="the call to finish")
        call = next(iter(ep.finished.values()))
        call_s = call.media.frames_in * 0.02  # the caller's 20 ms frames: how long media flowed
    log = out.decode(errors="replace")
    assert "Call established" in log, log[-3000:]
    assert call.end_reason == "caller hung up (BYE)"
    heard = _read(next((tmp_path / "heard").glob("*-dec.wav")))
    assert call_s > 4.0
    assert len(heard) / 8000 >= 0.8 * call_s, (len(heard) / 8000, call_s)  # agent audio through the call
    windows = heard[: len(heard) // 160 * 160].reshape(-1, 160)
    audible = np.sqrt((windows**2).mean(axis=1)) > 1e-3
    assert audible.mean() >= 0.8, (
        audible.mean()
    )  # agent audio, not silence, in at least 80 % of 20 ms windows
    record = tmp_path / f"{call.call_sid}.json"
    assert record.is_file()
    rtp = json.loads(record.read_text())["rtp"]  # a softphone's real RTP (and RTCP) in the record
    assert rtp["packets_received"] >= call_s * 50 * 0.8 and 0.0 <= rtp["loss_fraction"] <= 1.0, rtp
    assert 0.0 <= rtp["jitter_ms"] < 200.0 and rtp["packets_sent"] > 0, rtp
    assert 0.0 <= rtp.get("rtt_ms", 0.0) < 1000.0, rtp  # present once baresip's report names our SR


async def test_send_dtmf_tool_reaches_baresip(tmp_path):
    """The built-in `send_dtmf` tool, run as the router would on a live call, presses keys that baresip
    decodes (RFC 4733)."""
    from duetaspan.adapters.sip.bridge import bind_actions
    from duetaspan.registry import CallContext, ToolRegistry
    from duetaspan.tools import send_dtmf

    assert BARESIP is not None
    conf = softphone_config(tmp_path, "greeting", pad_s=3.0)
    registry = ToolRegistry([send_dtmf])
    results = []

    async def presses_keys(call) -> None:
        context = CallContext(call_id=call.call_sid)
        bind_actions(call, context)
        await asyncio.sleep(0.5)
        results.append(await registry.call("send_dtmf", {"digits": "15#9"}, context))
        await call.ended.wait()

    async with endpoint_on_loopback(presses_keys) as ep:
        proc = await asyncio.create_subprocess_exec(
            BARESIP, "-f", str(conf), "-e", f"/dial sip:agent@127.0.0.1:{ep.port}", "-t", "30",
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
    log = out.decode(errors="replace")
    assert results and results[0].ok, results
    # baresip names each key as its event starts; it reports an event's end only when the next one begins
    # (aiortp sends an event's packets in one burst, see docs/sip.md), so the last key's end is not checked
    starts = [
        line.split("'")[1] for line in log.splitlines() if "received event:" in line and "(end=0)" in line
    ]
    assert starts == list("15#9"), log[-3000:]
