"""The store's admin routes on a real HTTP server (uvicorn on loopback, aiohttp as the client), on both stores:
`GET /admin/calls` filters (time range as epoch seconds or ISO 8601, outcome, number, campaign by name) and
the viewer's role; who may start a campaign or change the do-not-call list (the admin token, even on the local
demo, where reads are open); bad lists and settings refused with the reason."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import uvicorn
from fastapi import FastAPI

from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole
from duetaspan.config.store import CampaignConfig
from duetaspan.outbound.api import StoreRoutes
from duetaspan.store import CallEntry
from tests.support import free_port

TOKEN = "store-admin-token-0123456789"


@contextlib.asynccontextmanager
async def served(store, *, token: str | None, demo: bool):
    app = FastAPI()
    app.state.admin = BearerRole("admin", token, ADMIN_TOKEN_ENV, open_without_token=demo)
    StoreRoutes(store, CampaignConfig()).mount(app)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    from tests.adapters.sip.peer import wait_for

    await wait_for(lambda: server.started or task.done(), timeout_s=30, what="uvicorn")
    try:
        async with aiohttp.ClientSession(base_url=f"http://127.0.0.1:{port}") as client:
            yield client
    finally:
        server.should_exit = True
        await task


async def _call(client, method, path, token=None, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with client.request(method, path, headers=headers, **kw) as r:
        body = await r.json() if r.content_type == "application/json" else await r.text()
        return r.status, body


async def test_calls_filters_and_the_viewer_role(store):
    async with store.transaction() as tx:
        await tx.index_call(CallEntry("A", transport="sip", from_number="+15550001", started_at=1_000.0,
                                      outcome="answered", campaign_id="cmp_x"))
        await tx.index_call(CallEntry("B", transport="twilio", to_number="+15550002", started_at=2_000.0,
                                      outcome="busy"))
    async with served(store, token=TOKEN, demo=False) as client:
        assert (await _call(client, "GET", "/admin/calls"))[0] == 401
        assert (await _call(client, "GET", "/admin/calls", token="wrong-token-000000000"))[0] == 401
        assert (await _call(client, "GET", f"/admin/calls?token={TOKEN}"))[0] == 401  # header only
        status, body = await _call(client, "GET", "/admin/calls", TOKEN)
        assert status == 200 and [c["id"] for c in body["calls"]] == ["B", "A"]
        ids = lambda b: [c["id"] for c in b["calls"]]  # noqa: E731
        assert ids((await _call(client, "GET", "/admin/calls?outcome=busy", TOKEN))[1]) == ["B"]
        assert ids((await _call(client, "GET", "/admin/calls?number=%2B15550001", TOKEN))[1]) == ["A"]
        assert ids((await _call(client, "GET", "/admin/calls?since=1500", TOKEN))[1]) == ["B"]
        assert ids((await _call(client, "GET", "/admin/calls?until=1970-01-01T00:25:00Z", TOKEN))[1]) == ["A"]
        assert ids((await _call(client, "GET", "/admin/calls?campaign=cmp_x", TOKEN))[1]) == ["A"]
        status, body = await _call(client, "GET", "/admin/calls?since=yesterday", TOKEN)
        assert status == 400 and "ISO 8601" in body["error"]


async def test_who_may_start_a_campaign(store):
    csv = "to,name\n+15551230001,Ann\n"
    async with served(store, token=None, demo=True) as client:  # the first-run demo: reads open, dialling not
        assert (await _call(client, "GET", "/admin/calls"))[0] == 200
        status, body = await _call(client, "POST", "/admin/campaigns", json={"csv": csv})
        assert status == 403 and "admin token" in body["error"]
        assert (await _call(client, "POST", "/admin/dnc", json={"add": ["+15551230001"]}))[0] == 403
    async with served(store, token=TOKEN, demo=False) as client:
        assert (await _call(client, "POST", "/admin/campaigns", json={"csv": csv}))[0] == 401
        status, body = await _call(client, "POST", "/admin/campaigns", TOKEN, json={"csv": "to\nnot-a-number\n"})
        assert status == 400 and "line 2" in body["error"]
        status, body = await _call(client, "POST", "/admin/campaigns", TOKEN,
                                   json={"csv": csv, "settings": {"window": "21:00-08:00"}})
        assert status == 400 and "window" in body["error"]
        status, body = await _call(client, "POST", "/admin/campaigns", TOKEN,
                                   json={"csv": csv, "settings": {"rm_rf": 1}})
        assert status == 400 and "rm_rf" in body["error"]
        status, body = await _call(client, "POST", "/admin/campaigns", TOKEN, json={"csv": csv, "name": "c1"})
        assert status == 201 and body["total"] == 1 and body["counts"] == {"pending": 1}
        assert (await _call(client, "POST", "/admin/campaigns", TOKEN, json={"csv": csv, "name": "c1"}))[0] == 409
        assert (await _call(client, "POST", "/admin/campaigns/c1/pause", TOKEN))[1]["state"] == "paused"
        assert (await _call(client, "POST", "/admin/campaigns/c1/resume", TOKEN))[1]["state"] == "running"
        assert (await _call(client, "POST", "/admin/campaigns/c1/cancel", TOKEN))[1]["state"] == "cancelled"
        assert (await _call(client, "POST", "/admin/campaigns/c1/resume", TOKEN))[0] == 409
        status, text = await _call(client, "GET", "/admin/campaigns/c1/export", TOKEN)
        assert status == 200 and text == "to,attempts,outcome,last_attempt_at\n+15551230001,0,not_called,\n"
        status, body = await _call(client, "POST", "/admin/dnc", TOKEN, json={"add": ["+1 555 123 0001"]})
        assert status == 200 and body == {"added": 1, "removed": 0}
        assert (await _call(client, "GET", "/admin/dnc", TOKEN))[1]["numbers"][0]["number"] == "+15551230001"


async def _cli(*args: str, token: str | None = TOKEN) -> tuple[int, str]:
    """`duetaspan campaign ...` as users run it (the venv's interpreter), its exit status and output."""
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV} | ({ADMIN_TOKEN_ENV: token} if token else {})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "duetaspan", "campaign", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, out.decode(errors="replace")


async def test_the_cli_s_flags_are_the_campaign_s_own_settings(store, tmp_path):
    """`campaign start --max-concurrent --calls-per-minute --window --days --max-attempts --ring-timeout-s`:
    each flag is stored as the campaign's own setting (what the scheduler runs it with: test_scheduler.py's
    `agent.campaign` test shows they win over `[campaign]`); unset ones keep the server's; a bad value is
    refused with its reason and nothing is created."""
    from duetaspan.outbound.scheduler import effective_settings

    contacts = tmp_path / "contacts.csv"
    contacts.write_text("to,name\n+15551230001,Ann\n+15551230002,Bo\n")
    async with served(store, token=TOKEN, demo=False) as client:
        server = str(client._base_url)
        code, out = await _cli("start", str(contacts), "--server", server, "--name", "flags", "--max-concurrent",
                               "3", "--calls-per-minute", "7.5", "--window", "10:00-18:30", "--days", "mon, wed,fri",
                               "--max-attempts", "2", "--ring-timeout-s", "20", "--detach")  # fmt: skip
        assert code == 0, out
        assert "campaign flags started: 2 numbers" in out
        code, out = await _cli("start", str(contacts), "--server", server, "--name", "plain", "--detach")
        assert code == 0, out
        code, out = await _cli("start", str(contacts), "--server", server, "--name", "bad", "--window",
                               "18:00-09:00", "--detach")  # fmt: skip
        assert code == 1 and "window" in out and "HTTP 400" in out, out
        code, out = await _cli("start", str(contacts), "--server", server, "--name", "unsigned", "--detach",
                               token=None)  # fmt: skip
        assert code == 1 and "HTTP 401" in out, out
    async with store.transaction() as tx:
        flags, plain = await tx.campaign("flags"), await tx.campaign("plain")
        assert await tx.campaign("bad") is None and await tx.campaign("unsigned") is None
    assert flags is not None and plain is not None
    assert flags.settings == {"max_concurrent": 3, "calls_per_minute": 7.5, "window": "10:00-18:30",
                              "days": ["mon", "wed", "fri"], "max_attempts": 2, "ring_timeout_s": 20.0}  # fmt: skip
    assert plain.settings == {}
    run = effective_settings(CampaignConfig(), flags.settings)
    assert (run.max_concurrent, run.window, run.days, run.ring_timeout_s) == (3, "10:00-18:30", ["mon", "wed", "fri"], 20.0)
    assert run.reserve_inbound == CampaignConfig().reserve_inbound  # not given: the server's
