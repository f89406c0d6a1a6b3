"""`send_dtmf` on a Twilio call: the keys go in band, as DTMF tone pairs in the stream's mu-law audio (Media
Streams carry no RFC 4733 events, and a `<Play digits>` update would replace the call's `<Connect><Stream>`).
A real Twilio-protocol WebSocket client receives the agent's audio; the keys are read back from it with an
FFT against the keypad's row and column tones."""

from __future__ import annotations

import asyncio

import numpy as np

from duetaspan.adapters.twilio.audio import DTMF_FREQS, dtmf_tones, ulaw_to_int16
from duetaspan.agent import Agent
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.twilio.peer import renumber, serve_agent_on_twilio
from tests.support import load_twilio_stream

ROWS, COLS = (697, 770, 852, 941), (1209, 1336, 1477, 1633)


def _power(spec: np.ndarray, hz: float, rate: int) -> float:
    k = round(hz * 1024 / rate)
    return float(spec[k - 6 : k + 7].sum())  # the Hann window's main lobe, zero-padded 1024 points


def read_keys(pcm: np.ndarray, rate: int = 8000) -> str:
    """The keys in `pcm`: 40 ms windows whose strongest row and column tones hold most of the energy."""
    keys, last, n = [], "", int(0.04 * rate)
    window = np.hanning(n)
    for i in range(0, len(pcm) - n, n // 2):
        spec = np.abs(np.fft.rfft(pcm[i : i + n] * window, 1024)) ** 2
        row = max(ROWS, key=lambda hz, s=spec: _power(s, hz, rate))
        col = max(COLS, key=lambda hz, s=spec: _power(s, hz, rate))
        share = (_power(spec, row, rate) + _power(spec, col, rate)) / (float(spec.sum()) + 1e-12)
        key = next((k for k, f in DTMF_FREQS.items() if f == (row, col)), "") if share > 0.8 else ""
        if key and key != last:
            keys.append(key)
        last = key
    return "".join(keys)


def test_the_tones_read_back():
    assert read_keys(dtmf_tones("15#9*0", 8000)) == "15#9*0"


async def test_send_dtmf_on_a_twilio_call_is_heard_in_band(tmp_path):
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path, seed=0, max_calls=2)
    sessions = capture_sessions(agent)
    async with agent, serve_agent_on_twilio(agent) as (peer, _service):
        messages = renumber(load_twilio_stream("self_correction"), "CA-keys")
        url = await peer.stream_url("CA-keys")
        async with peer.open_stream(url) as ws:
            play = asyncio.create_task(peer.play(ws, messages))
            for _ in range(400):
                if sessions and sessions[0].context is not None:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            sessions[0].context.request_action("send_dtmf", target="15#")  # as the built-in tool does
            got = await play
    audio = ulaw_to_int16(b"".join(got.media_bytes())).astype(np.float32) / 32768.0
    assert "15#" in read_keys(audio), read_keys(audio)
