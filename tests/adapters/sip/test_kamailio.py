"""The SIP endpoint behind Kamailio (Debian `kamailio` 5.6: real, record-routing, stateful proxies), two in a
row so the route set's order counts: a call from SIPp through both to us, whose ACK, re-INVITE and our BYE
go through both proxies (their logs say so, and SIPp checks the BYE came from the first); and a call we place
through an authenticating Kamailio (407 digest challenge, answered with `[sip] user` and the password) and a
second one to a SIPp callee, whose ACK and our BYE take the 2xx's route set, reversed. Loopback only."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import (
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    wait_for,
)

KAMAILIO = shutil.which("kamailio")
MODULES = Path("/usr/lib/x86_64-linux-gnu/kamailio/modules")
pytestmark = [
    needs_sipp,
    sip_e2e,
    pytest.mark.skipif(
        KAMAILIO is None, reason="Kamailio not installed: apt-get install kamailio (scripts/test.sh)"
    ),
]

PASSWORD = "edge-secret-9"

CONFIG = """#!KAMAILIO
debug=2
fork=yes
children=1
log_stderror=yes
listen=udp:127.0.0.1:{port}
mpath="{modules}/"
loadmodule "tm.so"
loadmodule "sl.so"
loadmodule "rr.so"
loadmodule "maxfwd.so"
loadmodule "textops.so"
loadmodule "pv.so"
loadmodule "siputils.so"
loadmodule "xlog.so"
{auth_module}
request_route {{
    xlog("L_NOTICE", "PROXY $rm $ru\\n");
    if (!mf_process_maxfwd_header("10")) {{ sl_send_reply("483", "Too Many Hops"); exit; }}
    if (has_totag()) {{
        if (loose_route()) {{ t_relay(); exit; }}
        if (is_method("ACK")) {{ if (t_check_trans()) {{ t_relay(); }} exit; }}
        sl_send_reply("404", "Not here"); exit;
    }}
    if (is_method("CANCEL")) {{ if (t_check_trans()) {{ t_relay(); }} exit; }}
    {auth}
    if (is_method("INVITE|SUBSCRIBE")) {{ record_route(); }}
    $du = "sip:127.0.0.1:{next_port}";
    t_relay();
}}
"""
AUTH = (
    'if (is_method("INVITE")) { if (!pv_proxy_authenticate("$fd", "' + PASSWORD + '", "0")) {'
    ' proxy_challenge("$fd", "0"); exit; } consume_credentials(); }'
)


@contextlib.asynccontextmanager
async def kamailio(
    tmp_path: Path, name: str, port: int, next_port: int, *, auth: bool = False
) -> AsyncIterator[Path]:
    """A Kamailio on 127.0.0.1:`port` sending new requests to `next_port`; yields its log (stderr)."""
    assert KAMAILIO is not None
    folder = tmp_path / name
    folder.mkdir()
    cfg = folder / "k.cfg"
    cfg.write_text(CONFIG.format(port=port, next_port=next_port, modules=MODULES, auth=AUTH if auth else "",
                                 auth_module='loadmodule "auth.so"' if auth else ""))  # fmt: skip
    log = folder / "kamailio.log"
    with log.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            KAMAILIO, "-f", str(cfg), "-DD", "-E", "-w", str(folder), "-P", str(folder / "k.pid"),
            stdout=out, stderr=out,
        )  # fmt: skip
        try:
            await udp_bound(port)
            yield log
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


def record_routes(*ports: int) -> str:
    """A SIPp regexp (XML-escaped): the Record-Route headers of these proxies, one after the other, in order."""
    one = r"Record-Route: &lt;sip:127\.0\.0\.1:{};lr[^&]*&gt;"
    return r"[^\n]*\n".join(one.format(port) for port in ports)


def methods(log: Path) -> list[str]:
    return [
        line.split("PROXY ", 1)[1].split()[0]
        for line in log.read_text(errors="replace").splitlines()
        if "PROXY " in line
    ]


async def test_inbound_call_through_two_record_routing_kamailios(tmp_path):
    async def talk(call) -> None:
        await call.confirmed.wait()
        await asyncio.sleep(2.0)  # the caller's re-INVITE comes meanwhile; then we hang up (BYE)

    first, second = free_udp_port(), free_udp_port()
    async with checked_endpoint(talk) as ep:
        async with (
            kamailio(tmp_path, "k2", second, ep.port) as log2,
            kamailio(tmp_path, "k1", first, second) as log1,
        ):
            rr = record_routes(second, first)
            path = scenario("caller_via_proxies", tmp_path, USER="agent", AGENT_PORT=ep.port, FIRST_PORT=first,
                            RR_RE=rr)  # fmt: skip
            got = await run_sipp(f"127.0.0.1:{first}", tmp_path, "-sf", str(path), "-m", "1")
            assert got.rc == 0, got.output + got.errors
            await wait_for(lambda: len(ep.finished) == 1, what="the call over")
            call = next(iter(ep.finished.values()))
            assert call.end_reason == "agent ended the call"
            await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered through both")
            for log in (log1, log2):  # the dialog's requests went through each proxy, not around it
                seen = methods(log)
                assert seen.count("INVITE") == 2 and seen.count("ACK") == 2 and "BYE" in seen, (log, seen)


async def test_outbound_call_through_an_authenticating_kamailio_and_a_second(tmp_path):
    async def short(call) -> None:
        await asyncio.sleep(1.0)

    first, second, callee = free_udp_port(), free_udp_port(), free_udp_port()
    rr = record_routes(second, first)
    path = scenario("callee_via_proxies", tmp_path, LAST_PORT=second, RR_RE=rr)
    sipp = asyncio.create_task(
        run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=callee, name="callee")
    )
    await udp_bound(callee)
    settings = dict(outbound_proxy=f"127.0.0.1:{first}", user="7001", register_password=PASSWORD)
    async with checked_endpoint(short, **settings) as ep:
        async with (
            kamailio(tmp_path, "k2", second, callee) as log2,
            kamailio(tmp_path, "k1", first, second, auth=True) as log1,
        ):
            result = await ep.dial(f"sip:callee@127.0.0.1:{callee}")
            assert result.outcome == "answered", result.summary()
            got = await sipp
            assert got.rc == 0, got.output + got.errors
            call = result.call
            await wait_for(lambda: call.signalling.get("BYE") == "200", what="our BYE answered")
            assert methods(log1).count("INVITE") == 2  # challenged (407), then with our Proxy-Authorization
            assert methods(log2).count("INVITE") == 1  # only the authenticated one got past the edge
            for log in (log1, log2):
                seen = methods(log)
                assert "ACK" in seen and "BYE" in seen, (log, seen)


@pytest.mark.slow
async def test_sipstone_calls_through_a_kamailio_edge_to_serve_sip(tmp_path):
    """The reported failure: `serve --sip --model tiny-random` behind the standard record-routing edge; SIPp's
    SipStone calls (their ACK and BYE by the route set from our 200's Record-Route; SIPp's built-in `-sn uac`
    sends no Route, so it cannot pass any record-routing proxy) all complete through Kamailio."""
    from tests.adapters.sip.test_serve_sip import serve_sip

    edge = free_udp_port()
    async with serve_sip(tmp_path, "--max-calls", "3") as (_, sip_port, _proc):
        async with kamailio(tmp_path, "edge", edge, sip_port) as log:
            path = scenario("sipstone_routed", tmp_path, USER="agent", AGENT_PORT=sip_port, TALK_MS=1000)
            got = await run_sipp(f"127.0.0.1:{edge}", tmp_path, "-sf", str(path), "-m", "3", "-l", "3")
            assert got.rc == 0, got.output + got.errors
            assert got.count("Successful call") == 3 and got.count("Failed call") == 0
            seen = methods(log)
            assert seen.count("INVITE") == 3 and seen.count("ACK") == 3 and seen.count("BYE") == 3, seen
