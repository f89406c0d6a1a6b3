"""The relied-on `duetaspan serve --twilio` and `duetaspan call` command lines (issue #6), as real
subprocesses: flags, paths (/twilio/voice, /twilio/stream/<token>, /twilio/status, /health), signatures, a
recorded call through the real CLI on `--model tiny-random` with `--record-dir`, and an outbound call placed
against a loopback fake of Twilio's REST API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys

import pytest

from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    AUTH_TOKEN,
    PUBLIC_URL,
    FakeTwilioRest,
    TwilioPeer,
    renumber,
)
from tests.support import REPO_ROOT, free_port, load_twilio_stream, stop_process, wait_until_healthy

CLI = [sys.executable, "-m", "duetaspan"]


def _env(rest_url: str = "http://127.0.0.1:9") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_"))}
    env |= {
        "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
        "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
        "TWILIO_API_BASE_URL": rest_url,
    }
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def _spawn(cmd: list[str], folder) -> tuple[subprocess.Popen, object]:
    log = (folder / "serve.log").open("wb")
    return subprocess.Popen(cmd, env=_env(), stdout=log, stderr=subprocess.STDOUT, cwd=folder), log


@contextlib.asynccontextmanager
async def serve_process(tmp_path, *extra: str):
    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text('[persona]\nprompt = "You answer the phone for a test."\n')
    cmd = [
        *CLI, "-v", "serve", "--twilio", "--host", "127.0.0.1", "--port", str(port), "--public-url", PUBLIC_URL,
        "--config", str(config), "--model", "tiny-random", "--record-dir", str(tmp_path / "calls"), *extra,
    ]  # fmt: skip
    proc, log = _spawn(cmd, tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve")
        yield base, proc
    finally:
        stop_process(proc)
        log.close()


@pytest.mark.serial  # asserts the frames the engine makes in real time: CPU quiet
async def test_serve_twilio_cli_answers_a_recorded_call(tmp_path):
    async with serve_process(tmp_path) as (base, proc):
        peer = TwilioPeer(base)
        assert (await peer.voice("CA-cli", signature=None))[0] == 403  # unsigned webhook refused
        url = await peer.stream_url("CA-cli")
        assert url.startswith("wss://agent.example.test/twilio/stream/")
        messages = renumber(load_twilio_stream("time_tokyo"), "CA-cli")
        n_in = sum(m["event"] == "media" for m in messages)
        async with peer.open_stream(url) as ws:
            got = await peer.play(ws, messages, linger_s=0.3)
        record_path = tmp_path / "calls" / "CA-cli.json"
        for _ in range(100):
            if record_path.exists():
                break
            await asyncio.sleep(0.05)
        status = await peer.post_form("/twilio/status", {"CallSid": "CA-cli", "CallStatus": "completed"})
        assert status[0] == 204
        assert proc.poll() is None
    assert got.close_code == 1000
    record = json.loads(record_path.read_text())
    # every 80 ms frame the engine produced went back as four 20 ms chunks (bar those queued when `stop` came);
    # how many frames a loaded 2-core machine manages in real time is the engine's business, not checked here
    frames = record["summary"]["frames"]
    assert 10 <= frames <= n_in / 4 + 15
    assert 4 * frames - 12 <= len(got.of("media")) <= 4 * frames
    n_out = len(got.of("media"))
    assert len(got.of("mark")) in (n_out // 50, n_out // 50 - 1)  # one playout mark per second of audio
    assert record["complete"] is True and record["meta"]["transport"] == "twilio"
    assert (tmp_path / "calls" / "CA-cli.wav").stat().st_size > 44
    log = (tmp_path / "serve.log").read_text()
    assert AUTH_TOKEN not in log
    assert url.rsplit("/", 1)[1] not in log  # the stream token is redacted, in uvicorn's lines too
    assert "/twilio/stream/<token>" in log


def test_serve_requires_public_url_and_credentials(tmp_path):
    no_url = subprocess.run(
        [*CLI, "serve", "--twilio"], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert no_url.returncode != 0 and "--public-url" in no_url.stderr
    env = {k: v for k, v in _env().items() if k != "TWILIO_AUTH_TOKEN"}
    no_token = subprocess.run(
        [*CLI, "serve", "--twilio", "--public-url", PUBLIC_URL, "--model", "tiny-random"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_token.returncode != 0 and "TWILIO_AUTH_TOKEN" in no_token.stderr


async def test_call_cli_places_the_call_through_rest(tmp_path):
    fake = FakeTwilioRest()
    async with fake.running() as rest_url:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "call", "+15551234567", "--from", "+15557654321", "--public-url", PUBLIC_URL,
            env=_env(rest_url), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip().startswith("CA")
    [request] = fake.requests
    assert request["path"] == f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls.json"
    form = request["form"]
    assert form["To"] == "+15551234567" and form["From"] == "+15557654321"
    assert form["Url"] == f"{PUBLIC_URL}/twilio/voice" and form["Method"] == "POST"
    assert form["StatusCallback"] == f"{PUBLIC_URL}/twilio/status"
    assert [v for k, v in request["multi"] if k == "StatusCallbackEvent"] == [
        "initiated",
        "ringing",
        "answered",
        "completed",
    ]
    assert request["auth"].startswith("Basic ")


async def test_call_cli_with_twilio_unreachable_says_so_in_one_line(tmp_path):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the connection is refused
    proc = await asyncio.create_subprocess_exec(
        *CLI, "call", "+15551234567", "--from", "+15557654321", "--public-url", PUBLIC_URL,
        env=_env(closed), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _out, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = err.decode().strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in err.decode(), lines
    assert lines[0].startswith("duetaspan call: error: place a call to +15551234567: Twilio's REST API at ")
    assert closed in lines[0] and "cannot be reached" in lines[0]


async def test_serve_twilio_cli_takes_public_url_and_port_from_the_config(tmp_path):
    """`serve --twilio --config agent.toml` without --public-url/--port: `[twilio] public_url` signs the
    webhook, `[server]` says where to listen, `[recording] audio = false` leaves no wav."""
    port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[persona]\nprompt = "You answer the phone for a test."\n[twilio]\npublic_url = "{PUBLIC_URL}"\n'
        f'[server]\nhost = "127.0.0.1"\nport = {port}\n[recording]\nenabled = true\ndir = "calls"\naudio = false\n'
    )
    cmd = [*CLI, "serve", "--twilio", "--config", str(config), "--model", "tiny-random", "--no-retrieval"]
    proc, log = _spawn(cmd, tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve")
        peer = TwilioPeer(base)  # signs over PUBLIC_URL: the server checks against the file's URL
        url = await peer.stream_url("CA-toml")
        assert url.startswith("wss://agent.example.test/twilio/stream/")
        messages = renumber(load_twilio_stream("time_tokyo"), "CA-toml")
        media = [m for m in messages if m["event"] == "media"][:40]
        head = [m for m in messages if m["event"] in ("connected", "start")]
        async with peer.open_stream(url) as ws:
            await peer.play(ws, [*head, *media, *[m for m in messages if m["event"] == "stop"]], linger_s=0.2)
        record = tmp_path / "calls" / "CA-toml.json"
        for _ in range(100):
            if record.exists():
                break
            await asyncio.sleep(0.05)
    finally:
        stop_process(proc)
        log.close()
    assert json.loads(record.read_text())["complete"] is True
    assert not (tmp_path / "calls" / "CA-toml.wav").exists()
    assert f"ready: Twilio voice webhook {PUBLIC_URL}/twilio/voice" in (tmp_path / "serve.log").read_text()


async def test_call_cli_takes_number_and_url_from_the_config(tmp_path):
    config = tmp_path / "agent.toml"
    config.write_text(f'[twilio]\npublic_url = "{PUBLIC_URL}"\nphone_number = "+15557654321"\n')
    fake = FakeTwilioRest()
    async with fake.running() as rest_url:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "call", "+15551234567", "--config", str(config),
            env=_env(rest_url), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip().startswith("CA")
    [request] = fake.requests
    form = request["form"]
    assert form["From"] == "+15557654321" and form["Url"] == f"{PUBLIC_URL}/twilio/voice"


def test_call_cli_needs_a_from_number():
    no_from = subprocess.run(
        [*CLI, "call", "+15551234567", "--public-url", PUBLIC_URL],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert no_from.returncode != 0 and "[twilio] phone_number" in no_from.stderr


@pytest.mark.parametrize("number", ["5551234567", "+1-555-123"])
def test_call_cli_rejects_numbers_that_are_not_e164(number):
    result = subprocess.run(
        [*CLI, "call", number, "--from", "+15557654321", "--public-url", PUBLIC_URL],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "E.164" in result.stderr
