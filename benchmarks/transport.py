"""What the Twilio transport path costs per call, and the latency it adds before the model hears the caller.

Model excluded. Per call and per second of audio the path is:
  inbound  50 x (validate the JSON message, base64-decode, mu-law decode, resample 8 -> 24 kHz), blocked into
           80 ms model frames;
  outbound 12.5 x (80 ms of 24 kHz agent audio -> resample 24 -> 8 kHz, mu-law encode, cut into four 20 ms
           chunks, serialise as Twilio `media` JSON).
Two variants: `standalone` (this adapter resamples, soxr QQ) and `agent` (what `serve --twilio` runs: the
adapter only decodes mu-law; the pipeline's service resamples with its own resampler and cuts frames).

Figures printed:
  - CPU seconds per call-second on one core, hence concurrent call streams per core (target >= 100);
    Pipecat's `TwilioFrameSerializer` doing the same job is timed for comparison when importable;
  - the latency from a caller's packet arriving to its audio being in a complete model frame: frame
    blocking (the wait for the rest of the 80 ms frame) + resampler delay + processing time
    (target <= 80 ms + 5 ms);
  - what `/metrics` costs the engine clock: the per-tick bookkeeping the engine thread does for it (two
    histogram observations, the concealed-frame count over every slot), as a share of the 80 ms tick, and
    the time one scrape takes to render (it runs on the event loop, not on the clock).

Run:  python benchmarks/transport.py [--seconds 20] [--calls 8]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import platform
import time

import numpy as np

from duetaspan.adapters.twilio.audio import CHUNK_BYTES, MulawDecoder, MulawEncoder, int16_to_ulaw
from duetaspan.adapters.twilio.messages import media_message, parse_message
from duetaspan.model.convention import FRAME_SIZE, SAMPLE_RATE

MAX_MSG = 16_384


def caller_messages(seconds: float, seed: int) -> list[str]:
    """A caller's inbound media messages: a noisy voice-band signal as 20 ms mu-law chunks."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 8000)
    t = np.arange(n) / 8000
    pcm = 0.2 * np.sin(2 * np.pi * 220 * t) * (
        0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)
    ) + 0.02 * rng.standard_normal(n)
    ulaw = int16_to_ulaw(np.clip(pcm * 32767, -32768, 32767).astype(np.int16))
    out = []
    for i in range(0, len(ulaw) - CHUNK_BYTES + 1, CHUNK_BYTES):
        seq = i // CHUNK_BYTES + 2
        payload = base64.b64encode(ulaw[i : i + CHUNK_BYTES]).decode()
        out.append(json.dumps({
            "event": "media", "sequenceNumber": str(seq), "streamSid": "MZ" + "0" * 32,
            "media": {"track": "inbound", "chunk": str(seq - 1), "timestamp": str((seq - 2) * 20), "payload": payload},
        }))  # fmt: skip
    return out


def agent_frames(seconds: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(seconds * 12.5)
    return [(0.1 * rng.standard_normal(FRAME_SIZE)).astype(np.float32) for _ in range(n)]


class Blocker:
    """Cuts a sample stream into exact model frames (as the pipeline does)."""

    def __init__(self) -> None:
        self.buf = np.zeros(0, np.float32)

    def push(self, pcm: np.ndarray) -> int:
        self.buf = np.concatenate([self.buf, pcm])
        n = len(self.buf) // FRAME_SIZE
        self.buf = self.buf[n * FRAME_SIZE :]
        return n


def _pipeline_resampler():
    try:
        from duetaspan.pipeline.resample import StreamResampler

        return lambda: StreamResampler(8000, SAMPLE_RATE)
    except ImportError:  # pragma: no cover - the pipeline ships with the SDK
        return None


def run_path(variant: str, inbound: list[str], frames: list[np.ndarray]) -> tuple[float, list[float]]:
    """CPU seconds for one call's inbound+outbound path; per-chunk inbound processing times (s)."""
    make_rs = _pipeline_resampler()
    decoder = MulawDecoder(SAMPLE_RATE if variant == "standalone" else 8000)
    resampler = make_rs() if variant == "agent" and make_rs else None
    encoder = MulawEncoder(SAMPLE_RATE)
    blocker = Blocker()
    pending = bytearray()
    per_chunk: list[float] = []
    cpu0 = time.process_time()
    for i, text in enumerate(inbound):
        t0 = time.perf_counter()
        msg = parse_message(text, MAX_MSG)
        pcm = decoder.decode(msg.audio(1600))
        if resampler is not None:
            pcm = resampler.process(pcm)
        blocker.push(pcm)
        per_chunk.append(time.perf_counter() - t0)
        if i % 4 == 3 and i // 4 < len(frames):  # one agent frame out per 80 ms
            pending += encoder.encode(frames[i // 4])
            while len(pending) >= CHUNK_BYTES:
                media_message("MZ" + "0" * 32, bytes(pending[:CHUNK_BYTES]))
                del pending[:CHUNK_BYTES]
    return time.process_time() - cpu0, per_chunk


def resampler_delay_ms(variant: str) -> float:
    """Group delay of the inbound resampling (impulse in, peak out), in ms."""
    if variant == "standalone":
        dec = MulawDecoder(SAMPLE_RATE)
        rs = lambda x: dec._resampler.resample_chunk(x)  # noqa: E731
    else:
        make_rs = _pipeline_resampler()
        if make_rs is None:
            return float("nan")
        r = make_rs()
        rs = r.process
    x = np.zeros(8000, np.float32)
    x[2000] = 1.0
    y = np.concatenate([rs(x[i : i + 160]) for i in range(0, len(x), 160)])
    return (int(np.argmax(np.abs(y))) - 2000 * 3) / SAMPLE_RATE * 1000.0


def blocking_wait_ms(variant: str, n_chunks: int = 400) -> tuple[float, float]:
    """Mean and max time a chunk's audio waits for its 80 ms frame to complete (stream time)."""
    decoder = MulawDecoder(SAMPLE_RATE if variant == "standalone" else 8000)
    make_rs = _pipeline_resampler()
    resampler = make_rs() if variant == "agent" and make_rs else None
    produced = 0  # samples out of the resampler so far
    emitted_frames = 0
    waiting: list[tuple[int, int]] = []  # (chunk index, sample index its last sample lands on)
    waits = []
    for i in range(n_chunks):
        pcm = decoder.decode(b"\xff" * CHUNK_BYTES)
        if resampler is not None:
            pcm = resampler.process(pcm)
        # the chunk's last input sample maps to output sample (i+1)*480 - 1 (+ resampler delay, measured apart)
        waiting.append((i, (i + 1) * 480 - 1))
        produced += len(pcm)
        emitted_frames = produced // FRAME_SIZE
        while waiting and waiting[0][1] < emitted_frames * FRAME_SIZE:
            j, _ = waiting.pop(0)
            waits.append((i - j) * 20.0)
    return float(np.mean(waits)), float(np.max(waits))


async def _concurrent(variant: str, calls: int, seconds: float) -> float:
    """All calls interleaved on one event loop, as a server runs them; returns CPU s per call-second."""
    inbound = [caller_messages(seconds, seed) for seed in range(calls)]
    frames = [agent_frames(seconds, seed) for seed in range(calls)]
    cpu0 = time.process_time()
    for call in range(calls):
        run_path(variant, inbound[call], frames[call])
        await asyncio.sleep(0)
    return (time.process_time() - cpu0) / (calls * seconds)


def pipecat_reference(seconds: float) -> float | None:
    """CPU s per call-second of Pipecat's TwilioFrameSerializer (deserialize + serialize), if importable."""
    try:
        from pipecat.clocks.system_clock import SystemClock
        from pipecat.frames.frames import OutputAudioRawFrame
        from pipecat.processors.frame_processor import FrameProcessorSetup
        from pipecat.serializers.twilio import TwilioFrameSerializer
    except ImportError:
        return None

    async def go() -> float:
        ser = TwilioFrameSerializer("MZ1", params=TwilioFrameSerializer.InputParams(auto_hang_up=False))
        await ser.setup(
            FrameProcessorSetup(
                clock=SystemClock(), task_manager=None, pipeline_worker=None, audio_in_sample_rate=SAMPLE_RATE
            )
        )  # type: ignore[call-arg]
        inbound = caller_messages(seconds, 0)
        frames = [
            OutputAudioRawFrame(
                audio=(f * 32767).astype(np.int16).tobytes(), sample_rate=SAMPLE_RATE, num_channels=1
            )
            for f in agent_frames(seconds, 0)
        ]
        cpu0 = time.process_time()
        for i, text in enumerate(inbound):
            await ser.deserialize(text)
            if i % 4 == 3 and i // 4 < len(frames):
                await ser.serialize(frames[i // 4])
        return (time.process_time() - cpu0) / seconds

    try:
        return asyncio.run(go())
    except Exception as exc:  # an API drift in Pipecat must not break our own figures
        print(f"  (Pipecat reference skipped: {type(exc).__name__}: {exc})")
        return None


def metrics_cost(ticks: int, slots: int) -> tuple[float, float]:
    """(ns of metrics bookkeeping per engine tick with `slots` calls, ms per `/metrics` scrape)."""
    from types import SimpleNamespace

    from duetaspan.observability.metrics import ServeMetrics
    from duetaspan.pipeline.runner import ClockStats

    clock = ClockStats()
    rng = np.random.default_rng(0)
    steps, lateness = rng.uniform(0.005, 0.09, ticks), rng.uniform(0.0, 0.01, ticks)
    silence = np.zeros(FRAME_SIZE, np.float32)
    # (pcm, concealed, frame number) per slot, as EngineRunner._tick holds them; a third of the slots concealed
    taken = {slot: (silence, slot % 3 == 0, 0) for slot in range(slots)}
    t0 = time.perf_counter()
    for step_s, late_s in zip(steps.tolist(), lateness.tolist(), strict=True):
        # exactly the line EngineRunner._tick adds for /metrics
        clock.timing.observe(step_s, late_s, sum(concealed for _, concealed, _ in taken.values()))
    per_tick_ns = (time.perf_counter() - t0) / ticks * 1e9
    runner = SimpleNamespace(clock=clock, active_calls=slots, free_slots=0, running=True, crashes=0)
    metrics = ServeMetrics(engine=lambda: runner, transports=("twilio", "webrtc"))
    metrics.declare_tools(f"tool_{i}" for i in range(20))
    metrics.render()
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        metrics.render()
    return per_tick_ns, (time.perf_counter() - t0) / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="audio per simulated call")
    ap.add_argument("--calls", type=int, default=8, help="simulated concurrent calls")
    args = ap.parse_args()
    print(
        f"transport path benchmark: {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    print(f"{args.calls} calls x {args.seconds:g} s of audio each, model excluded, one core\n")
    for variant in ("standalone", "agent"):
        # warm-up (tables, soxr plans, pydantic)
        run_path(variant, caller_messages(1, 99), agent_frames(1, 99))
        cpu_per_s = asyncio.run(_concurrent(variant, args.calls, args.seconds))
        _, per_chunk = run_path(variant, caller_messages(args.seconds, 1), agent_frames(args.seconds, 1))
        proc_ms = np.array(per_chunk) * 1000
        delay = resampler_delay_ms(variant)
        wait_mean, wait_max = blocking_wait_ms(variant)
        worst = wait_max + max(delay, 0.0) + float(np.percentile(proc_ms, 99))
        print(f"[{variant}]")
        print(
            f"  CPU per call-second         {cpu_per_s * 1000:8.3f} ms  -> {1 / cpu_per_s:8.0f} call streams per core"
            f"  (target >= 100)"
        )
        print(
            f"  inbound processing / chunk  p50 {np.percentile(proc_ms, 50) * 1000:6.1f} us, "
            f"p99 {np.percentile(proc_ms, 99) * 1000:6.1f} us"
        )
        print(f"  resampler delay             {delay:8.2f} ms")
        print(f"  frame blocking wait         mean {wait_mean:5.1f} ms, max {wait_max:5.1f} ms")
        print(f"  packet -> model input       worst {worst:6.1f} ms  (target <= 85.0 ms)\n")  # fmt: skip
    per_tick_ns, scrape_ms = metrics_cost(100_000, args.calls)
    print(f"[metrics] per engine tick ({args.calls} calls)  {per_tick_ns / 1000:8.2f} us  "
          f"({per_tick_ns / 80e6 * 100:.4f} % of the 80 ms tick)")  # fmt: skip
    print(f"[metrics] one /metrics scrape            {scrape_ms:8.2f} ms  (on the event loop, per scrape)\n")
    ref = pipecat_reference(args.seconds)
    if ref is not None:
        print(f"[reference] Pipecat TwilioFrameSerializer (VHQ soxr, 24 kHz pipeline): {ref * 1000:.3f} ms CPU per "
              f"call-second -> {1 / ref:.0f} call streams per core")  # fmt: skip


if __name__ == "__main__":
    main()
