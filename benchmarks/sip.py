"""What the SIP transport costs per call, model excluded, beside the Twilio transport's figure.

SIPp (Debian `sip-tester`) places `--calls` concurrent calls to a `SipEndpoint` on loopback, each streaming
`--seconds` of G.711 mu-law RTP (a voice-band test signal) and hanging up with BYE. The endpoint's handler does
what the agent's pipeline does around the model: it takes every 20 ms frame from aiortp's jitter buffer and
resamples it 8 -> 24 kHz (soxr, as the service does), and every 80 ms hands the transport one 80 ms frame of
24 kHz "agent" audio (resampled to 8 kHz, cut into 20 ms frames, paced out as RTP). SIP signalling, RTP/RTCP
in and out, the jitter buffer, concealment and pacing are all in the figure; the model is not.

Figures printed: CPU seconds of this process per call-second (hence call streams per core), RTP packets in
and out per call, concealed frames, and the same figure for the Twilio transport (benchmarks/transport.py,
run as a subprocess) for comparison.

With `--baresip` (Debian `baresip-core`), baresip also dials the endpoint as a softphone and records what it
hears (`sndfile`): the gap statistics of the agent audio it received (share of silent 20 ms windows, longest
gap) are printed; the test suite only checks that the agent is heard through 80 % of the call.

Run:  python benchmarks/sip.py [--seconds 10] [--calls 8] [--baresip]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soxr

from duetaspan.adapters.sip.endpoint import SipEndpoint, SipSettings
from duetaspan.adapters.twilio.audio import int16_to_ulaw
from duetaspan.model.convention import FRAME_SIZE, SAMPLE_RATE

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "adapters" / "sip" / "scenarios" / "caller_audio.xml"


def caller_ulaw(seconds: float) -> bytes:
    t = np.arange(int(seconds * 8000)) / 8000
    pcm = 0.2 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return int16_to_ulaw(np.clip(pcm * 32767, -32768, 32767).astype(np.int16))


async def agent_like(call) -> None:
    """The pipeline's work around the model: inbound resampling, one 80 ms output frame per 80 ms."""
    loop = asyncio.get_running_loop()
    up = soxr.ResampleStream(8000, SAMPLE_RATE, 1, dtype="float32", quality="QQ")
    frame = (0.1 * np.sin(np.arange(FRAME_SIZE) * 0.05)).astype(np.float32)

    async def inbound() -> None:
        async for pcm in call.media.audio():
            up.resample_chunk(pcm.astype(np.float32) / 32768)

    reader = asyncio.ensure_future(inbound())
    next_at = loop.time()
    while not call.ended.is_set():
        call.media.send_audio(frame)
        next_at += FRAME_SIZE / SAMPLE_RATE
        await asyncio.sleep(max(0.0, next_at - loop.time()))
    reader.cancel()


async def run(seconds: float, calls: int) -> dict[str, float]:
    sipp = shutil.which("sipp")
    if sipp is None:
        raise SystemExit("SIPp not installed: apt-get install sip-tester")
    folder = Path(tempfile.mkdtemp(prefix="sip-bench-"))
    audio = folder / "caller.raw"
    audio.write_bytes(caller_ulaw(seconds))
    text = SCENARIO.read_text()
    for key, value in {"PT": 0, "CODEC": "PCMU", "AUDIO": audio, "TALK_MS": int(seconds * 1000),
                       "DTMF": "/usr/share/sip-tester/dtmf_2833_1.pcap"}.items():  # fmt: skip
        text = text.replace("{{" + key + "}}", str(value))
    (folder / "scenario.xml").write_text(text)
    endpoint = SipEndpoint(SipSettings(host="127.0.0.1", port=0), agent_like, max_calls=calls)
    await endpoint.start()
    cpu0, wall0 = time.process_time(), time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sipp, f"127.0.0.1:{endpoint.port}", "-sf", str(folder / "scenario.xml"), "-m", str(calls), "-l",
        str(calls), "-r", str(calls), "-i", "127.0.0.1", "-mi", "127.0.0.1", "-nostdin", "-timeout",
        f"{int(seconds + 60)}s", cwd=folder, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    rc = await proc.wait()
    for _ in range(600):  # the last BYEs are being processed
        if not endpoint.calls:
            break
        await asyncio.sleep(0.05)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    finished = list(endpoint.finished.values())
    call_seconds = sum(c.media.frames_in for c in finished) * 0.02
    stats = [c.media.stats() for c in finished]
    await endpoint.aclose()
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "sipp_rc": rc,
        "calls": len(finished),
        "wall_s": wall,
        "call_seconds": call_seconds,
        "cpu_per_call_second": cpu / max(call_seconds, 1e-9),
        "packets_in": float(np.mean([s["frames_in"] for s in stats])) if stats else 0.0,
        "packets_out": float(np.mean([s.get("packets_sent", 0) for s in stats])) if stats else 0.0,
        "concealed": float(np.mean([s.get("concealed_frames", 0) for s in stats])) if stats else 0.0,
    }


BARESIP_CONFIG = """poll_method epoll
sip_listen 127.0.0.1:0
audio_source aufile,{wav}
audio_player aufile,/dev/null
audio_alert aufile,/dev/null
ausrc_srate 8000
auplay_srate 8000
module_path /usr/lib/baresip/modules
module stdio.so
module g711.so
module aufile.so
module sndfile.so
module_app account.so
module_app menu.so
snd_path {snd}
"""


async def baresip_gaps(seconds: float) -> dict[str, float]:
    """baresip calls an agent-like endpoint for `seconds`; gaps in the agent audio it heard."""
    import wave

    baresip = shutil.which("baresip")
    if baresip is None:
        raise SystemExit("baresip not installed: apt-get install baresip-core")
    folder = Path(tempfile.mkdtemp(prefix="sip-bench-baresip-"))
    wav, snd, conf = folder / "mic.wav", folder / "heard", folder / "conf"
    snd.mkdir()
    conf.mkdir()
    with wave.open(str(wav), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(np.zeros(int(seconds * 8000), np.int16).tobytes())
    (conf / "config").write_text(BARESIP_CONFIG.format(wav=wav, snd=snd))
    (conf / "accounts").write_text("<sip:bench@127.0.0.1>;regint=0\n")
    endpoint = SipEndpoint(SipSettings(host="127.0.0.1", port=0), agent_like, max_calls=1)
    await endpoint.start()
    proc = await asyncio.create_subprocess_exec(
        baresip, "-f", str(conf), "-e", f"/dial sip:agent@127.0.0.1:{endpoint.port}", "-t", str(int(seconds + 15)),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await proc.wait()
    await endpoint.aclose()
    heard = next(snd.glob("*-dec.wav"))
    with wave.open(str(heard)) as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
    shutil.rmtree(folder, ignore_errors=True)
    windows = pcm[: len(pcm) // 160 * 160].reshape(-1, 160)
    silent = np.sqrt((windows**2).mean(axis=1)) <= 1e-3
    longest = run = 0
    for quiet in silent[5:]:  # the first 100 ms: before the agent's first frame
        run = run + 1 if quiet else 0
        longest = max(longest, run)
    return {"heard_s": len(pcm) / 8000, "silent_share": float(silent[5:].mean()), "longest_gap_ms": longest * 20.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--baresip", action="store_true", help="also measure gaps heard by baresip")
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; {args.calls} calls x {args.seconds:.0f} s")  # fmt: skip
    r = asyncio.run(run(args.seconds, args.calls))
    per = r["cpu_per_call_second"]
    print(f"SIP transport (model excluded): {per * 1000:.1f} ms CPU per call-second -> "
          f"~{1 / per:.0f} call streams per core")  # fmt: skip
    print(f"  {r['calls']:.0f} calls (SIPp exit {r['sipp_rc']:.0f}), {r['call_seconds']:.1f} call-seconds of "
          f"media in {r['wall_s']:.1f} s; per call {r['packets_in']:.0f} frames in, {r['packets_out']:.0f} RTP out, "
          f"{r['concealed']:.1f} frames concealed")  # fmt: skip
    if args.baresip:
        g = asyncio.run(baresip_gaps(args.seconds))
        print(f"baresip heard {g['heard_s']:.1f} s of agent audio: {g['silent_share'] * 100:.1f} % silent 20 ms "
              f"windows, longest gap {g['longest_gap_ms']:.0f} ms")  # fmt: skip
    print(
        "Twilio transport, for comparison (benchmarks/transport.py: codec and JSON work on one thread, no sockets,"
    )
    print(
        "  no event loop, no pacing timers; the SIP figure above includes real UDP sockets, aiortp's per-packet"
    )
    print("  Python, its playout and pacing clocks and RTCP):")
    twilio = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "transport.py"), "--seconds", "5",
                             "--calls", "2"], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    for line in twilio.stdout.splitlines():
        if "per call-second" in line or "streams per core" in line or "cpu" in line.lower():
            print("  " + line.strip())


if __name__ == "__main__":
    main()
