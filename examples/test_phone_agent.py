"""The README's one-file phone agent (`examples/phone_agent.py`) runs as written: started as a subprocess on
`tiny-random`, its `agent.run(twilio=True, ...)` serves /health and answers Twilio's signed voice webhook with
the stream TwiML, and Ctrl-C ends it cleanly (exit status 0, no traceback)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer
from tests.support import REPO_ROOT, free_port, stop_process, wait_until_healthy


def _start(folder, env: dict[str, str]) -> tuple[subprocess.Popen, object]:
    """`python examples/phone_agent.py`, as the README says, logging into the test's folder."""
    log = (folder / "agent.log").open("wb")
    script = str(REPO_ROOT / "examples" / "phone_agent.py")
    return subprocess.Popen(
        [sys.executable, script],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        # the default Ctrl-C even when the test runner runs with SIGINT ignored (a background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    ), log


async def test_readme_phone_agent_serves_the_twilio_webhook(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_"))}
    env |= {"TWILIO_ACCOUNT_SID": ACCOUNT_SID, "TWILIO_AUTH_TOKEN": AUTH_TOKEN, "PUBLIC_URL": PUBLIC_URL,
            "PORT": str(port), "DUETASPAN_MODEL": "tiny-random", "PYTHONPATH": str(REPO_ROOT)}  # fmt: skip
    proc, log = _start(tmp_path, env)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_until_healthy(base, proc, tmp_path / "agent.log", what="the phone agent")
        peer = TwilioPeer(base)
        status, twiml = await peer.voice("CA-readme")
        assert status == 200 and re.search(
            r'<Stream [^>]*url="wss://agent\.example\.test/twilio/stream/[^"]+"', twiml
        )
        assert (await peer.voice("CA-forged", signature="forged"))[0] == 403
        proc.send_signal(signal.SIGINT)  # Ctrl-C: agent.run returns, the script ends
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        stop_process(proc)
        log.close()
    assert (tmp_path / "calls").is_dir()  # record_dir="calls", checked at start
    assert "Traceback" not in (tmp_path / "agent.log").read_text()


def _run_to_the_end(folder, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "phone_agent.py")],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    # Pipecat prints its version banner (loguru, INFO) when it is imported: not part of the error
    return done.returncode, "\n".join(line for line in done.stderr.splitlines() if "Pipecat " not in line)


def test_without_public_url_or_credentials_the_script_says_so_in_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_", "PUBLIC_URL"))}
    env |= {"DUETASPAN_MODEL": "tiny-random", "PYTHONPATH": str(REPO_ROOT)}
    rc, err = _run_to_the_end(tmp_path, env)
    assert rc == 1 and err.strip().splitlines() == [
        "error: set PUBLIC_URL to the https URL Twilio reaches you at (e.g. your ngrok URL)"
    ], err
    rc, err = _run_to_the_end(tmp_path, env | {"PUBLIC_URL": PUBLIC_URL})
    lines = err.strip().splitlines()
    assert rc == 1 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("error: TWILIO_ACCOUNT_SID and TWILIO_AUTH_TOKEN not set"), lines
