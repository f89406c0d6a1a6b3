"""What one call costs on the production path, model excluded: SIP calls per core beside Twilio's.

Both transports run exactly what `duetaspan serve` runs for a call: the transport (SIP: the endpoint, aiortp's
RTP/RTCP, jitter buffer, playout and pacing, latching; Twilio: the Media Streams WebSocket server with its
signature check, JSON and mu-law), the Pipecat pipeline with the Pipecat transport (`SipPipecatTransport` /
`TwilioTransport`), the `DuetaSpanService` (8 -> 24 kHz resampling, the leveller, 80 ms framing, the agent's
24 kHz output back to 8 kHz) and the engine runner's 80 ms clock, with the model replaced by a zero-cost
engine (`ZeroEngine`: a precomputed tone every step, so every agent frame goes out as audio).

SIP: SIPp (Debian `sip-tester`, its own process: not in the figure) places `--calls` concurrent calls to the
endpoint, each streaming `--seconds` of G.711 mu-law RTP, then BYE. Twilio: as many concurrent calls over
real WebSockets to the Twilio routes of a loopback uvicorn server, each playing a recorded Media Stream for
`--seconds`; the WebSocket client runs in this process, so its JSON and socket work is in the Twilio figure
(an upper bound). Figure: CPU seconds of this process (all its threads) per call-second, and its inverse,
calls per core.

With `--baresip` (Debian `baresip-core`), baresip also dials the agent as a softphone and records what it
hears (`sndfile`): the gap statistics of the agent audio it received (share of silent 20 ms windows, longest
gap) are printed.

Run:  python benchmarks/sip.py [--seconds 10] [--calls 8] [--baresip]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("NO_TORCH_COMPILE", "1")
os.environ.setdefault("NO_CUDA_GRAPH", "1")

from duetaspan import Agent
from duetaspan.adapters.sip.endpoint import SipSettings
from duetaspan.adapters.sip.serve import build_endpoint
from duetaspan.adapters.twilio.audio import int16_to_ulaw
from duetaspan.model.convention import FRAME_SIZE, SAMPLE_RATE
from tests.adapters.sip.peer import free_udp_port
from tests.adapters.twilio.peer import renumber, serve_agent_on_twilio
from tests.support import load_twilio_stream

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "tests" / "adapters" / "sip" / "scenarios" / "caller_audio.xml"


class ZeroEngine:
    """The `DuplexEngine` contract at no cost: every step, every slot speaks the same precomputed 80 ms tone."""

    def __init__(self, slots: int) -> None:
        self.max_slots = slots
        tone = (0.2 * np.sin(2 * np.pi * 220 * np.arange(FRAME_SIZE) / SAMPLE_RATE)).astype(np.float32)
        self._result = SimpleNamespace(pcm=tone, text="", is_ret=False, silent=False, spans=[], step_ms=0.0,
                                       frame_index=0)  # fmt: skip
        self._free = list(range(slots))

    def open_slot(self, persona=None, sampling=None, seed=None) -> int:
        return self._free.pop(0)

    def close_slot(self, slot: int) -> None:
        self._free.append(slot)

    def inject(self, slot: int, reference: str) -> bool:
        return False

    def force_ret(self, slot: int) -> None:
        pass

    def step(self, pcm: dict) -> dict:
        return {slot: self._result for slot in pcm}


def caller_ulaw(seconds: float) -> bytes:
    t = np.arange(int(seconds * 8000)) / 8000
    pcm = 0.2 * np.sin(2 * np.pi * 220 * t) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return int16_to_ulaw(np.clip(pcm * 32767, -32768, 32767).astype(np.int16))


def agent(calls: int, record_dir: Path | None = None) -> Agent:
    return Agent(engine=ZeroEngine(calls), router=False, max_calls=calls, record_dir=record_dir)


async def sip_calls(seconds: float, calls: int) -> dict[str, float]:
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
    bot = agent(calls)
    async with bot:
        endpoint = build_endpoint(SipSettings(host="127.0.0.1", port=0), bot, None)  # as `serve --sip` does
        await endpoint.start()
        cpu0, wall0 = time.process_time(), time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sipp, f"127.0.0.1:{endpoint.port}", "-sf", str(folder / "scenario.xml"), "-m", str(calls), "-l",
            str(calls), "-r", str(calls), "-i", "127.0.0.1", "-mi", "127.0.0.1", "-mp", str(free_udp_port() // 2 * 2),
            "-p", str(free_udp_port()), "-nostdin", "-timeout",
            f"{int(seconds + 60)}s", cwd=folder, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        rc = await proc.wait()
        for _ in range(600):  # the last BYEs are being processed
            if not endpoint.calls and bot.admission.held == 0:
                break
            await asyncio.sleep(0.05)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        finished = list(endpoint.finished.values())
        call_seconds = sum((c.ended_at or wall0) - (c.media.started_at or wall0) for c in finished)  # ACK to end
        stats = [c.media.stats() for c in finished]
        await endpoint.aclose()
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "rc": rc,
        "calls": len(finished),
        "wall_s": wall,
        "call_seconds": call_seconds,
        "cpu_per_call_second": cpu / max(call_seconds, 1e-9),
        "packets_in": float(np.mean([s["frames_in"] for s in stats])) if stats else 0.0,
        "packets_out": float(np.mean([s.get("packets_sent", 0) for s in stats])) if stats else 0.0,
        "concealed": float(np.mean([s.get("concealed_frames", 0) for s in stats])) if stats else 0.0,
    }


async def twilio_calls(seconds: float, calls: int) -> dict[str, float]:
    recorded = load_twilio_stream("greeting")
    media = [m for m in recorded if m["event"] == "media"]
    n = int(seconds / 0.02)
    body = [media[i % len(media)] for i in range(n)]
    bot = agent(calls)
    async with bot, serve_agent_on_twilio(bot) as (peer, _service):
        plays = []
        for i in range(calls):
            sid = f"CA{i:032d}"
            messages = renumber([*recorded[:2], *body, recorded[-1]], sid)
            plays.append((await peer.stream_url(sid), messages))
        cpu0, wall0 = time.process_time(), time.monotonic()

        async def one(url: str, messages: list[dict]) -> int:
            async with peer.open_stream(url) as ws:
                got = await peer.play(ws, messages)
            return len(got.media_bytes())

        sent = await asyncio.gather(*(one(url, msgs) for url, msgs in plays))
        for _ in range(600):
            if bot.admission.held == 0:
                break
            await asyncio.sleep(0.05)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    call_seconds = calls * n * 0.02
    return {"calls": calls, "wall_s": wall, "call_seconds": call_seconds,
            "cpu_per_call_second": cpu / call_seconds, "media_out": float(np.mean(sent))}  # fmt: skip


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
    """baresip calls the agent (zero-cost engine) for `seconds`; gaps in the agent audio it heard."""
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
    bot = agent(1)
    async with bot:
        endpoint = build_endpoint(SipSettings(host="127.0.0.1", port=0), bot, None)
        await endpoint.start()
        proc = await asyncio.create_subprocess_exec(
            baresip, "-f", str(conf), "-e", f"/dial sip:agent@127.0.0.1:{endpoint.port}", "-t",
            str(int(seconds + 15)), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
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
    from loguru import logger as pipecat_log  # Pipecat logs every frame lifecycle at DEBUG: not in the figure

    pipecat_log.remove()
    pipecat_log.add(sys.stderr, level="WARNING")
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; {args.calls} concurrent calls x {args.seconds:.0f} s, zero-cost engine")  # fmt: skip
    sip = asyncio.run(sip_calls(args.seconds, args.calls))
    twilio = asyncio.run(twilio_calls(args.seconds, args.calls))
    for name, r in (("SIP", sip), ("Twilio", twilio)):
        per = r["cpu_per_call_second"]
        print(f"{name:>6}: {per * 1000:6.1f} ms CPU per call-second -> ~{1 / per:4.0f} calls per core "
              f"({r['calls']:.0f} calls, {r['call_seconds']:.0f} call-seconds in {r['wall_s']:.1f} s)")  # fmt: skip
    print(f"  SIP per call: {sip['packets_in']:.0f} frames in, {sip['packets_out']:.0f} RTP out, "
          f"{sip['concealed']:.1f} concealed (SIPp exit {sip['rc']:.0f}); Twilio per call: "
          f"{twilio['media_out']:.0f} media messages out")  # fmt: skip
    if args.baresip:
        g = asyncio.run(baresip_gaps(args.seconds))
        print(f"baresip heard {g['heard_s']:.1f} s of agent audio: {g['silent_share'] * 100:.1f} % silent 20 ms "
              f"windows, longest gap {g['longest_gap_ms']:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
