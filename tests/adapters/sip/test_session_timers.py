"""Session timers (RFC 4028) against SIPp as the caller, with a session interval of 2 s (the endpoint's Min-SE,
90 s in production, lowered through `SipSettings.session_min_se_s`, a test-only seam): a caller that is the
refresher and stops refreshing is hung up (BYE, `session expired`) before the interval runs out, not before
RFC 4028's deadline; where we are the refresher we send UPDATE at half the interval, go on after a 200 and end
the call with BYE when a refresh is answered 481 (`session refresh failed`). SIPp checks that our 200 OK names
the refresher it asked for. Behind a record-routing proxy (bare UDP peers) our refresh follows the route set."""

from __future__ import annotations

import pytest
from aiosipua.session_timer import watchdog_delay

from tests.adapters.sip.leaks import checked_endpoint
from tests.adapters.sip.peer import needs_sipp, run_sipp, scenario, sip_e2e, wait_for
from tests.adapters.sip.rawsip import Peer, ack, header, invite, reply

# serial: its calls mostly wait on SIP timers and SIPp (about 1 s of CPU in a minute of calls): in the serial
# lane beside the niced workers they fill that lane's idle time instead of holding a worker (CONTRIBUTING)
pytestmark = [needs_sipp, sip_e2e, pytest.mark.serial]
SE = 2  # seconds: the session interval the caller asks for


async def hold(call) -> None:
    """An agent that talks until the call is ended from elsewhere."""
    await call.ended.wait()


async def _one_call(tmp_path, name: str, **values):
    async with checked_endpoint(hold, session_min_se_s=1) as ep:
        path = scenario(name, tmp_path, SE=SE, BYE_TIMEOUT_MS=20000, **values)
        got = await run_sipp(f"127.0.0.1:{ep.port}", tmp_path, "-sf", str(path), "-m", "1", timeout_s=60)
        assert got.rc == 0, got.output + got.errors
        await wait_for(lambda: len(ep.finished) == 1, what="the call over")
        call = next(iter(ep.finished.values()))
        await wait_for(lambda: call.signalling.get("BYE") == "200", timeout_s=10, what="our BYE answered")
    return call


async def test_a_caller_that_stops_refreshing_is_hung_up(tmp_path):
    call = await _one_call(tmp_path, "session_expiry")
    assert call.end_reason == "session expired"
    lasted = call.ended_at - call.started_at
    assert watchdog_delay(SE) - 0.2 <= lasted < SE + 5, lasted  # RFC 4028 10's deadline, not earlier


async def test_we_refresh_and_a_failed_refresh_ends_the_call(tmp_path):
    call = await _one_call(tmp_path, "session_refresh", UPDATE_TIMEOUT_MS=20000)
    assert call.end_reason == "session refresh failed"
    assert call.ended_at - call.started_at >= SE - 0.2  # two refreshes at SE/2 each: the first one carried on


async def test_our_refresh_follows_the_route_set():
    """Behind a record-routing proxy our UPDATE refresh goes to the proxy with its Route (aiosipua's own refresh
    goes to the INVITE's source, around the proxy), and its 200 keeps the call up."""
    with Peer() as caller, Peer() as proxy:
        asks = (f"Supported: timer\r\nSession-Expires: {SE};refresher=uas\r\n"
                f"Record-Route: <sip:127.0.0.1:{proxy.port};lr>\r\n")  # fmt: skip
        async with checked_endpoint(hold, session_min_se_s=1) as ep:
            await caller.send(
                invite(ep.port, caller.port, branch="z9hG4bKr1", call_id="rr-1", extra=asks), ep.port
            )
            ok = (await caller.until(b"SIP/2.0 200"))[-1]
            assert header(ok, "session-expires") == f"{SE};refresher=uas"
            await caller.send(ack(ep.port, caller.port, ok), ep.port)
            update = [m for m in await proxy.until(b"UPDATE ", timeout_s=10) if m.startswith(b"UPDATE ")][-1]
            assert header(update, "route") == f"<sip:127.0.0.1:{proxy.port};lr>"
            await proxy.send(reply(update, "200 OK"), ep.port)
            again = [m for m in await proxy.until(b"UPDATE ", timeout_s=10) if m.startswith(b"UPDATE ")][-1]
            assert (
                header(again, "cseq") != header(update, "cseq") and "rr-1" in ep.calls
            )  # refreshed, still up
            await proxy.send(reply(again, "200 OK"), ep.port)
            await ep.calls["rr-1"].end_call("test over", drain_s=0)  # our BYE: to the proxy as well
            bye = [m for m in await proxy.until(b"BYE ", timeout_s=10) if m.startswith(b"BYE ")][-1]
            await proxy.send(reply(bye, "200 OK"), ep.port)
        assert not [m for m in await caller.collect(0.1) if m.startswith(b"UPDATE ")]  # none around the proxy


async def _answered(caller: Peer, ep, call_id: str, extra: str) -> bytes:
    await caller.send(
        invite(ep.port, caller.port, branch=f"z9hG4bK{call_id}", call_id=call_id, extra=extra), ep.port
    )
    ok = (await caller.until(b"SIP/2.0 200"))[-1]
    await caller.send(ack(ep.port, caller.port, ok), ep.port)
    return ok


async def test_a_session_expires_a_proxy_put_in_never_hangs_up_a_caller_without_timers():
    """A Session-Expires without `Supported: timer` (a proxy inserted it): the caller cannot refresh. Where its
    Allow (one comma-separated line, as phones send it) has UPDATE, we are the refresher; where it does not,
    no timer runs at all: the call outlives several intervals, with neither UPDATE nor BYE."""
    no_update = f"Session-Expires: {SE}\r\nAllow: INVITE, ACK, BYE, CANCEL, OPTIONS\r\n"
    with_update = f"Session-Expires: {SE};refresher=uac\r\nAllow: INVITE, ACK, BYE, CANCEL, UPDATE\r\n"
    with Peer() as caller:
        async with checked_endpoint(hold, session_min_se_s=1) as ep:
            ok = await _answered(caller, ep, "pse-1", no_update)
            assert header(ok, "session-expires") == ""  # no timer negotiated
            got = await caller.collect(3 * SE)
            assert not [m for m in got if m.startswith((b"UPDATE ", b"BYE "))] and "pse-1" in ep.calls
            await ep.calls["pse-1"].end_call("test over", drain_s=0)
            await caller.send(reply((await caller.until(b"BYE "))[-1], "200 OK"), ep.port)

            ok = await _answered(caller, ep, "pse-2", with_update)
            assert header(ok, "session-expires") == f"{SE};refresher=uas"  # not the uac it cannot be
            update = [m for m in await caller.until(b"UPDATE ", timeout_s=10) if m.startswith(b"UPDATE ")][-1]
            await caller.send(reply(update, "200 OK"), ep.port)
            await ep.calls["pse-2"].end_call("test over", drain_s=0)
            await caller.send(reply((await caller.until(b"BYE "))[-1], "200 OK"), ep.port)

            # a caller with timers that asks us to refresh, its Allow on one line: we do (aiosipua read no UPDATE)
            asks = f"Supported: timer\r\nSession-Expires: {SE};refresher=uas\r\nAllow: INVITE, ACK, BYE, UPDATE\r\n"
            ok = await _answered(caller, ep, "pse-3", asks)
            assert header(ok, "session-expires") == f"{SE};refresher=uas"
            update = [m for m in await caller.until(b"UPDATE ", timeout_s=10) if m.startswith(b"UPDATE ")][-1]
            await caller.send(reply(update, "200 OK"), ep.port)
            await ep.calls["pse-3"].end_call("test over", drain_s=0)
            await caller.send(reply((await caller.until(b"BYE "))[-1], "200 OK"), ep.port)
