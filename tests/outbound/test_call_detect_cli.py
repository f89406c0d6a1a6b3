"""`duetaspan call +1555... --server URL --detect` against a real `duetaspan serve --twilio` process whose
Twilio REST API is the loopback fake: the server places the call through `POST /admin/dial` (admin token),
the fake's callee answers over a real Twilio-protocol WebSocket with the "hello" fixture, and the command
prints the dial outcome and the verdict line; the call's record has the verdict."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys

from tests.adapters.sip.test_dial_cli import call_cli
from tests.adapters.twilio.peer import (
    ACCOUNT_SID,
    AUTH_TOKEN,
    PUBLIC_URL,
    FakeTwilioRest,
    TwilioPeer,
    renumber,
)
from tests.outbound.test_answer_calls import _stream
from tests.reliability.test_roles import _spawn
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy

ADMIN = "admin-token-for-call-detect"


async def test_call_detect_prints_who_answered(tmp_path):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    played: dict = {}

    async def callee(sid: str, form: dict) -> None:
        await asyncio.sleep(0.2)
        url = re.search(r'<Stream [^>]*url="([^"]+)"', form["Twiml"]).group(1)
        messages = renumber(_stream("hello.wav"), sid, ACCOUNT_SID)
        messages[1]["start"]["customParameters"] = dict(re.findall(r'<Parameter name="([^"]+)" value="([^"]*)"', form["Twiml"]))
        peer = TwilioPeer(base)
        async with peer.open_stream(url) as ws:
            played["got"] = await peer.play(ws, messages)

    fake = FakeTwilioRest(on_create=callee)
    async with fake.running() as rest_url:
        (tmp_path / "agent.toml").write_text('[persona]\nprompt = "You call people back."\n[twilio]\nphone_number = "+15557654321"\n')
        cmd = [sys.executable, "-m", "duetaspan", "-v", "serve", "--twilio", "--public-url", PUBLIC_URL,
               "--host", "127.0.0.1", "--port", str(port), "--config", str(tmp_path / "agent.toml"),
               "--model", "tiny-random", "--device", "cpu", "--record-dir", str(tmp_path / "calls")]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "DUETASPAN_"))}
        env |= {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN, "TWILIO_API_BASE_URL": rest_url,
                "DUETASPAN_ADMIN_TOKEN": ADMIN, "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
        proc = _spawn(cmd, env, tmp_path)
        try:
            await wait_until_healthy(base, proc, tmp_path / "serve.log", what="serve", timeout_s=180)
            rc, out, err = await call_cli("+15551234567", "--server", base, "--detect", token=ADMIN)
            assert rc == 0, (out, err)
            lines = out.strip().splitlines()
            assert re.match(r"^answered \+15551234567: call CA\d+ is on the agent$", lines[0]), out
            assert re.match(r"^answer: human \(0\.\d\d\) at \d\.\d\d s: ", lines[1]), out
            call_id = re.search(r"call (CA\d+)", lines[0]).group(1)
            for _ in range(600):
                if (tmp_path / "calls" / f"{call_id}.json").exists() and "got" in played:
                    break
                await asyncio.sleep(0.1)
        finally:
            stop_process(proc)
    record = json.loads((tmp_path / "calls" / f"{call_id}.json").read_text())
    assert record["meta"]["answer"]["verdict"] == "human" and record["meta"]["direction"] == "outbound"
    assert fake.requests[0]["form"]["From"] == "+15557654321"  # [twilio] phone_number
