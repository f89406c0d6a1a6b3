"""Helpers shared by the test suite: the caller audio fixtures (tests/fixtures/audio) and loopback servers on free ports.

Import them from tests as `from tests.support import ...` or use the fixtures in conftest.py.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib.util
import itertools
import json
import os
import re
import sys
import wave
from pathlib import Path

import numpy as np

from duetaspan.testing import servers as _servers

REPO_ROOT = Path(__file__).resolve().parent.parent
# The caller recordings the repository carries (24 kHz wavs made by scripts/make_fixtures.py); mu-law and
# Twilio Media Streams forms are derived from them here, so nothing is read from outside the repository.
AUDIO_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "audio"
TWILIO_CHUNK_BYTES = 160  # 20 ms of 8 kHz mu-law: one Twilio media message
# `@pytest.mark.serial` puts a test into this xdist group (tests/conftest.py): timing-sensitive tests run one
# after another on one worker instead of against each other.
SERIAL_GROUP = "serial"


@functools.cache
def benchmark_module(name: str):
    """A script of benchmarks/ (`answer_corpus`, `answer_detection`) imported as a module, once per process; the
    folder goes on sys.path so the scripts import each other, and the module is registered (dataclasses look
    their module up)."""
    path = REPO_ROOT / "benchmarks" / f"{name}.py"
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The test card number (4111 1111 1111 1111) in any form a leak takes ("4111 1111", "41111111", "4111-1111"), not
# "4111" alone: an ephemeral port (127.0.0.1:41112), a timestamp (1796304111.52) or a timing's decimals hold that.
CARD_LEAK = re.compile(r"4111[\s-]?1111")


def has_card(text: str) -> bool:
    """Whether `text` holds the test card number (4111 1111 1111 1111), or a part of it that gives it away."""
    return CARD_LEAK.search(text) is not None


def has_number(text: str, digits: str) -> bool:
    """Whether `text` holds `digits` (a PIN) as a number of its own: not inside a longer one (a process id
    "[21234]" in a server's log), nor in a float's decimals ("at_ms": 1046.2468...) or integer part (1234.5)."""
    return re.search(rf"(?<![\d.]){re.escape(digits)}(?!\.?\d)", text) is not None


def fixture_names() -> list[str]:
    """Names of the recorded caller phrases (`greeting`, `weather_sydney`, ...)."""
    return sorted(_phrases())


def fixture_phrase(name: str) -> str:
    """What the caller says in fixture `name`."""
    return _phrases()[name]


@functools.cache
def _phrases() -> dict[str, str]:
    path = AUDIO_FIXTURES / "PHRASES.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"caller fixtures missing: {path} (run scripts/make_fixtures.py to rebuild them)"
        )
    return json.loads(path.read_text())


def fixture_path(name: str) -> Path:
    """The 24 kHz wav of fixture `name`, with an error that names the fix when it is missing."""
    path = AUDIO_FIXTURES / f"{name}.wav"
    if not path.is_file():
        raise FileNotFoundError(
            f"caller fixture {name!r} missing: {path} (known: {', '.join(fixture_names())}; "
            "scripts/make_fixtures.py rebuilds them)"
        )
    return path


def load_wav(name: str) -> tuple[np.ndarray, int]:
    """A fixture wav as float32 mono in [-1, 1] and its sample rate (24 kHz for the fixtures)."""
    path = Path(name) if str(name).endswith(".wav") else fixture_path(name)
    with wave.open(str(path), "rb") as w:
        assert w.getsampwidth() == 2, f"{path}: expected 16-bit PCM"
        frames = w.readframes(w.getnframes())
        pcm = np.frombuffer(frames, dtype="<i2").astype(np.float32) / 32768.0
        if w.getnchannels() > 1:
            pcm = pcm.reshape(-1, w.getnchannels()).mean(axis=1)
        return pcm, w.getframerate()


@functools.cache
def load_ulaw(name: str) -> bytes:
    """A fixture as raw 8 kHz mu-law bytes (what a phone line carries), derived from its 24 kHz wav."""
    import soxr

    from duetaspan.adapters.twilio.audio import float_to_int16, int16_to_ulaw

    pcm, rate = load_wav(name)
    narrow = soxr.resample(pcm, rate, 8000, quality="VHQ").astype(np.float32)
    return int16_to_ulaw(float_to_int16(np.clip(narrow, -1.0, 1.0)))


def twilio_stream_messages(ulaw: bytes, name: str = "fixture") -> list[dict]:
    """`ulaw` as Twilio Media Streams sends it: connected, start, one media message per 20 ms, stop."""
    stream_sid, call_sid, account_sid = "MZ" + "0" * 30, "CA" + "1" * 30, "AC" + "2" * 30
    messages: list[dict] = [
        {"event": "connected", "protocol": "Call", "version": "1.0.0"},
        {
            "event": "start",
            "sequenceNumber": "1",
            "streamSid": stream_sid,
            "start": {
                "accountSid": account_sid,
                "streamSid": stream_sid,
                "callSid": call_sid,
                "tracks": ["inbound"],
                "customParameters": {"fixture": name},
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            },
        },
    ]
    sequence = 2
    for chunk, offset in enumerate(range(0, len(ulaw), TWILIO_CHUNK_BYTES), start=1):
        payload = ulaw[offset : offset + TWILIO_CHUNK_BYTES].ljust(
            TWILIO_CHUNK_BYTES, b"\xff"
        )  # 0xff: silence
        messages.append(
            {
                "event": "media",
                "sequenceNumber": str(sequence),
                "streamSid": stream_sid,
                "media": {
                    "track": "inbound",
                    "chunk": str(chunk),
                    "timestamp": str(20 * (chunk - 1)),
                    "payload": base64.b64encode(payload).decode(),
                },
            }
        )
        sequence += 1
    messages.append(
        {
            "event": "stop",
            "sequenceNumber": str(sequence),
            "streamSid": stream_sid,
            "stop": {"accountSid": account_sid, "callSid": call_sid},
        }
    )
    return messages


def load_twilio_stream(name: str) -> list[dict]:
    """A caller fixture as a recorded Twilio Media Stream (connected, start, media..., stop); a fresh copy."""
    return json.loads(_twilio_stream_json(name))


@functools.cache
def _twilio_stream_json(name: str) -> str:
    return json.dumps(twilio_stream_messages(load_ulaw(name), name))


# loopback servers on free ports: public in `duetaspan.testing` (the suite's names stay)
free_port = _servers.free_port
serve_app = _servers.serve_app


# --- one xdist worker's own resources (docs/testing.md, "Running in parallel") ---------------------------------
# HTTP and SIP signalling ports come from the OS (`free_port`, `free_udp_port`) and folders from `tmp_path`. RTP
# is the exception: a SIP endpoint picks its media ports from a configured range (default 20000-20999), and a
# peer (baresip, SIPp) is told its range. So each worker gets its own block of RTP ports, below the OS's
# ephemeral range (32768+, where `free_port` answers come from): the first RTP_ENDPOINT_PORTS for the
# endpoints it starts (`worker_rtp_range`, `worker_sip_settings`, `worker_sip_toml`), the rest handed out in
# slices to the peers it starts (`peer_rtp_ports`). The endpoint's allocator also holds a pair from
# allocation to bind and skips a pair another process took (duetaspan.adapters.sip.ports), so even a range
# shared with another process (a second test run on the machine) costs a retry, never a failed call.
RTP_BASE = 22000
RTP_BLOCK = 400  # ports per worker: 26 blocks end at 32400
RTP_ENDPOINT_PORTS = 300
RTP_PEER_SLICE = 20


def worker_slot() -> int:
    """0 outside xdist, N + 1 in xdist worker `gwN` (`PYTEST_XDIST_WORKER`)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) + 1 if worker.startswith("gw") and worker[2:].isdigit() else 0


def worker_rtp_range() -> tuple[int, int]:
    """This worker's RTP ports for the SIP endpoints its tests start: (rtp_port_min, rtp_port_max)."""
    low = RTP_BASE + RTP_BLOCK * (worker_slot() % 26)
    return low, low + RTP_ENDPOINT_PORTS - 1


def worker_sip_settings() -> dict[str, int]:
    """`rtp_port_min`/`rtp_port_max` keyword arguments of `SipSettings` (or `SipConfig`) for this worker."""
    low, high = worker_rtp_range()
    return {"rtp_port_min": low, "rtp_port_max": high}


def worker_sip_toml() -> str:
    """The same as `[sip]` lines for a config file a `serve --sip` subprocess reads (put them under `[sip]`)."""
    return "".join(f"{key} = {value}\n" for key, value in worker_sip_settings().items())


_peer_slices = itertools.count()


def peer_rtp_ports(count: int = RTP_PEER_SLICE) -> tuple[int, int]:
    """A slice of `count` ports (even start) of this worker's peer block, for one baresip or SIPp: `(first,
    last)`; successive calls rotate through the block (a worker runs one test at a time)."""
    assert 2 <= count <= RTP_BLOCK - RTP_ENDPOINT_PORTS, count
    peer_low = worker_rtp_range()[0] + RTP_ENDPOINT_PORTS
    slices = (RTP_BLOCK - RTP_ENDPOINT_PORTS) // count
    first = peer_low + count * (next(_peer_slices) % slices)
    first += first % 2
    return first, first + count - 2


async def wait_until_healthy(base: str, proc, log: Path, *, what: str = "the server", timeout_s: float = 90):
    """Poll `base`/health until it answers 200; fail with the tail of `log` if `proc` dies first."""
    import asyncio
    import time

    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while True:
            assert proc.poll() is None, _log_tail(log)
            assert time.monotonic() < deadline, f"{what} never became ready"
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(base + "/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)


async def wait_until(predicate, timeout_s: float = 30.0, what: str = "the condition") -> None:
    """Poll `predicate()` every 50 ms until it is true; AssertionError naming `what` after `timeout_s` (the
    wait for an event that has no awaitable of its own; never a fixed sleep standing for it)."""
    import asyncio

    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(0.05)


def _log_tail(log: Path) -> str:
    return log.read_text()[-3000:]


def stop_process(proc, timeout_s: float = 15) -> None:
    """Terminate a server subprocess; kill it if it has not exited after `timeout_s`."""
    import subprocess

    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
