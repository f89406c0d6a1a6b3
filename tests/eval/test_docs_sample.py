"""docs/evals.md's sample scenario file, as the page shows it, passes in text mode against a scripted router
on loopback that makes the calls a correct agent makes; without its API key the same run prints the first
error and how to fix it (one line each, no table of zeros, no traceback) and exits non-zero."""

from __future__ import annotations

import json
import re

from tests.eval.test_cli_text import ALREADY, NONE, run_eval
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import REPO_ROOT


def tool_call(name: str, **arguments: object) -> dict:
    """A scripted LLM reply that calls `name` (native tool calling)."""
    return {"tool_call": {"name": name, "arguments": arguments}}


RIGHT_ROUTER = {
    "rules": [  # the router's user message holds the tool calls already made this turn
        {"match": [ALREADY, "book_table("], "reply": NONE},
        {"match": [ALREADY, "check_availability("], "reply": tool_call("book_table", people=4, time="7 PM")},
        {"match": ALREADY, "reply": NONE},
        {"match": "four people at seven", "reply": tool_call("check_availability", people=4, time="7 PM")},
        {"match": "make that eight", "reply": tool_call("check_availability", people=2, time="8 PM")},
    ],
    "default": NONE,
}


def docs_sample() -> str:
    """The first YAML block of docs/evals.md's "Scenario files" section."""
    text = (REPO_ROOT / "docs" / "evals.md").read_text()
    section = text[text.index("## Scenario files") :]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


async def test_the_docs_sample_passes_in_text_mode(tmp_path):
    (tmp_path / "restaurant.yaml").write_text(docs_sample())
    (tmp_path / "agent.toml").write_text('[router]\napi_key_env = ""\n')
    async with ScriptedLLMServer(RIGHT_ROUTER).serve() as url:
        rc, _out, err = await run_eval(
            "restaurant.yaml", "--text", "--config", "agent.toml", "--router-base-url", f"{url}/v1",
            "--report", "report.json", cwd=tmp_path,
        )  # fmt: skip
    assert rc == 0, err
    report = json.loads((tmp_path / "report.json").read_text())
    rows = {row["id"]: row for row in report["scenarios"]}
    assert set(rows) == {"book_for_four", "corrected_time", "small_talk"}
    assert report["pass_at_1"] == 1.0 and report["errors"] == 0, [
        (r["id"], r["reason"]) for r in rows.values()
    ]
    assert "booked" in rows["book_for_four"]["answer"]


async def test_eval_without_the_key_says_the_first_error_and_the_fix(tmp_path):
    (tmp_path / "restaurant.yaml").write_text(docs_sample())
    (tmp_path / "agent.toml").write_text(
        '[router]\napi_key_env = "DUETASPAN_TEST_UNSET_KEY"\ntimeout_s = 5\n'
    )
    no_key = {"default": {"status": 401, "body": "You didn't provide an API key."}}
    async with ScriptedLLMServer(no_key).serve() as url:
        rc, out, err = await run_eval(
            "restaurant.yaml", "--text", "--config", "agent.toml", "--router-base-url", f"{url}/v1",
            "--no-progress", cwd=tmp_path,
        )  # fmt: skip
    assert rc == 1 and "Traceback" not in err, err
    assert "pass@1" not in out  # no table of zeros
    lines = err.strip().splitlines()
    assert lines[0].startswith("every scenario (3) failed with an error; the first, book_for_four: ")
    assert "401" in lines[0] and "You didn't provide an API key" in lines[0], lines
    assert (
        lines[1].startswith("fix: export DUETASPAN_TEST_UNSET_KEY=<your key>")
        and "--router-base-url" in lines[1]
    )
    assert lines[2] == "every scenario's error: add --report report.json" and len(lines) == 3, lines
    assert "see the report" not in err


def docs_offline_recipe() -> tuple[dict, list[str]]:
    """docs/evals.md's offline recipe: its router script (the JSON block) and its commands (the bash block)."""
    text = (REPO_ROOT / "docs" / "evals.md").read_text()
    section = text[text.index("### Offline, with a scripted router") :]
    script = json.loads(re.search(r"```json\n(.*?)```", section, re.S).group(1))
    commands = re.search(r"```bash\n(.*?)```", section, re.S).group(1).strip().splitlines()
    return script, commands


def test_the_offline_recipe_runs_as_written(tmp_path):
    """The recipe's three commands, as the page writes them (only the port differs), pass the sample."""
    import shlex
    import socket
    import subprocess
    import sys
    import time

    from tests.support import free_port, stop_process

    script, commands = docs_offline_recipe()
    assert script == RIGHT_ROUTER, "the page's script and the test's router must be the same rules"
    serve, config, run = commands
    assert serve.endswith(" &") and config.startswith("printf ")
    port = free_port()
    (tmp_path / "restaurant.yaml").write_text(docs_sample())
    (tmp_path / "router_script.json").write_text(json.dumps(script))
    subprocess.run(config, shell=True, cwd=tmp_path, check=True)
    assert (tmp_path / "offline.toml").read_text() == '[router]\napi_key_env = ""\n'
    argv = shlex.split(serve.removesuffix("&").replace("8004", str(port)))
    assert argv[:3] == ["python", "-m", "duetaspan.testing.llm"]
    server = subprocess.Popen([sys.executable, *argv[1:]], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 120  # a busy 2-core box: the server imports aiohttp first
        while True:
            assert server.poll() is None, "the scripted LLM server exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the scripted LLM server never listened"
                time.sleep(0.2)
        argv = shlex.split(run.replace("8004", str(port)))
        assert argv[0] == "duetaspan"
        done = subprocess.run([sys.executable, "-m", "duetaspan", *argv[1:], "--no-progress"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        stop_process(server)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "report.json").read_text())["pass_at_1"] == 1.0
