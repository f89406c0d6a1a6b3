"""How agent audio reaches Twilio through Pipecat's own stack (`FastAPIWebsocketTransport` +
`TwilioFrameSerializer`) around `agent.service(call)`, with the pipeline at 24 kHz and at Twilio's 8 kHz.

A tone engine (no model: it speaks every frame, a few microseconds per step) runs behind the example bot of
examples/pipecat_twilio; a Twilio Media Streams client on a real WebSocket sends 20 ms of mu-law silence
every 20 ms and times each `media` message the bot sends back.

Figures printed per pipeline rate: media messages per second, payload bytes (min / median / max) and the
gaps between messages (p50 / p90 / max). At 24 kHz the serializer's buffering resampler turns the output
into bursts of ~1100 bytes; at 8 kHz the service resamples once and the transport sends 320-byte (40 ms)
chunks at a steady pace.

Run:  python benchmarks/pipecat_twilio.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import time

import numpy as np
import uvicorn
from fastapi import FastAPI, WebSocket
from pipecat.runner.types import WebSocketRunnerArguments
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from duetaspan import Agent
from duetaspan.model.convention import FRAME_SIZE, SAMPLE_RATE
from examples.pipecat_twilio.bot import run_bot


class ToneEngine:
    """Speaks a 220 Hz tone on every frame (the `DuplexEngine` contract, no model)."""

    max_slots = 1

    def __init__(self) -> None:
        self._i = 0

    def open_slot(self, persona=None, sampling=None, seed=None) -> int:
        return 0

    def close_slot(self, slot: int) -> None:
        pass

    def inject(self, slot: int, reference: str) -> bool:
        return False

    def force_ret(self, slot: int) -> None:
        pass

    def step(self, pcm: dict) -> dict:
        n = np.arange(FRAME_SIZE) + self._i * FRAME_SIZE
        self._i += 1
        audio = (0.3 * np.sin(2 * np.pi * 220 * n / SAMPLE_RATE)).astype(np.float32)
        result = type("R", (), {})()
        result.__dict__.update(
            pcm=audio, text="", is_ret=False, silent=False, spans=[], step_ms=0.01, frame_index=self._i
        )
        return {slot: result for slot in pcm}


async def one_call(rate: int, seconds: float, port: int) -> tuple[list[int], list[float]]:
    agent = Agent(engine=ToneEngine(), router=False, max_calls=1)
    app = FastAPI()

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await run_bot(agent, WebSocketRunnerArguments(websocket=websocket), rate=rate)

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the server failed to start: raise its error
        await asyncio.sleep(0.01)
    sizes: list[int] = []
    times: list[float] = []
    sid, call = "MZ" + "0" * 32, "CA" + "0" * 32
    start = {"streamSid": sid, "callSid": call, "accountSid": "AC" + "0" * 32, "customParameters": {}}
    silence = base64.b64encode(b"\xff" * 160).decode()
    async with agent, connect(f"ws://127.0.0.1:{port}/ws") as client:
        await client.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await client.send(json.dumps({"event": "start", "streamSid": sid, "start": start}))

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for raw in client:
                    msg = json.loads(raw)
                    if msg.get("event") == "media":
                        sizes.append(len(base64.b64decode(msg["media"]["payload"])))
                        times.append(time.monotonic())

        reader = asyncio.create_task(read())
        t0 = time.monotonic()
        for i in range(int(seconds / 0.02)):
            media = {"event": "media", "streamSid": sid, "media": {"payload": silence}}
            await client.send(json.dumps(media))
            await asyncio.sleep(max(0.0, t0 + (i + 1) * 0.02 - time.monotonic()))
        reader.cancel()
    server.should_exit = True
    await task
    return sizes, times


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--port", type=int, default=8771)
    args = parser.parse_args()
    print(f"{'pipeline':>9} {'msgs/s':>7} {'bytes min/med/max':>18} {'gap p50/p90/max ms':>20}")
    for rate in (24000, 8000):
        sizes, times = await one_call(rate, args.seconds, args.port)
        steady = slice(len(sizes) // 5, None)  # after the first second or two
        gaps = np.diff(times)[steady] * 1000.0
        s = np.asarray(sizes[steady])
        per_s = len(sizes) / (times[-1] - times[0])
        print(
            f"{rate:>7}Hz {per_s:7.1f} {s.min():>6}/{int(np.median(s)):>4}/{s.max():>5}"
            f" {np.percentile(gaps, 50):>8.1f}/{np.percentile(gaps, 90):>5.1f}/{gaps.max():>5.1f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
