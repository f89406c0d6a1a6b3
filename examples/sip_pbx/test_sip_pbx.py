"""The SIP front desk end to end on CPU: the example's `agent.toml` served by `agent.serve(sip=...)` (the code
path of `duetaspan serve --sip --config examples/sip_pbx/agent.toml`), called by SIPp from loopback. The
built-in `transfer_call` tool, run as the router would with `reception`, makes the endpoint send a REFER to the
configured `sip:100@10.0.0.2`, then our BYE; a caller outside `[sip] allow` gets 403."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import aiohttp

from duetaspan.agent import Agent
from duetaspan.testing.sessions import capture_sessions
from tests.adapters.sip.peer import free_udp_port, needs_sipp, run_sipp, scenario, sip_e2e
from tests.support import free_port, worker_sip_settings

HERE = Path(__file__).parent
pytestmark = [needs_sipp, sip_e2e]


async def test_front_desk_transfers_to_reception_by_refer(tmp_path, tiny_engine):
    agent = Agent.from_config(HERE / "agent.toml", engine=tiny_engine, max_calls=1, seed=0, router=False,
                              record_dir=tmp_path / "calls")  # fmt: skip
    sessions = capture_sessions(agent)
    port, sip_port = free_port(), free_udp_port()
    # the PBX of the example is 10.0.0.2; on loopback the test is the PBX
    server = asyncio.create_task(agent.serve(sip={"port": sip_port, "allow": ["127.0.0.1/32"], **worker_sip_settings()}, port=port))
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):
                assert not server.done(), server.exception()
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.05)
        path = scenario(
            "refer_accept", tmp_path, USER="7001", BYE_TIMEOUT_MS=20000, TARGET="sip:100@10.0.0.2"
        )
        call = asyncio.create_task(run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf", str(path), "-m", "1"))
        for _ in range(600):
            if sessions and sessions[0].context is not None:
                break
            await asyncio.sleep(0.05)
        assert sessions, "the call never reached the agent"
        result = await agent.registry.call("transfer_call", {"destination": "reception"}, sessions[0].context)
        assert result.ok, result
        got = await call
        assert got.rc == 0, got.output + got.errors  # REFER to reception, then our BYE
        refused = scenario("refused", tmp_path, USER="7001")  # 127.0.0.2 is loopback, but not the PBX
        stranger = await run_sipp(f"127.0.0.1:{sip_port}", tmp_path, "-sf", str(refused), "-m", "1",
                                  local_ip="127.0.0.2", name="stranger")  # fmt: skip
        assert stranger.rc == 0, stranger.output + stranger.errors  # 403 Forbidden
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    assert (tmp_path / "calls").is_dir() and list((tmp_path / "calls").glob("*.json"))
