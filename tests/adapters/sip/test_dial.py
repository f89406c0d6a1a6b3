"""Placing SIP calls against SIPp (real SIP software): through an outbound proxy / trunk that challenges the
INVITE (407 Proxy-Authenticate and 401 WWW-Authenticate, the digest checked by SIPp against the password
from `$DUETASPAN_SIP_PASSWORD`'s setting), with the Request-URI kept the callee's and the pre-loaded
`Route` on the INVITE, the retried INVITE and the BYE; every dial outcome (no-answer after the ring timeout
with CANCEL sent, busy, failed with the SIP status, no response at all, a host that does not resolve)
returned, counted in `duetaspan_sip_dial_total{outcome}` and written as a record (`transport: "sip"`,
`direction: "outbound"`, `outcome`, `sip_status`). Loopback only."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest

from duetaspan.adapters.sip.serve import dial_outcome
from duetaspan.observability.metrics import ServeMetrics
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

pytestmark = [needs_sipp, sip_e2e]

PASSWORD = "trunk-secret-7"
CALLEE = "sip:+15551234567@trunk.example"  # not resolvable here: only the proxy's address is dialled


async def short(call) -> None:
    await asyncio.sleep(1.0)  # then the handler ends: we hang up (BYE)


def _record(folder, call_id: str) -> dict:
    return json.loads((folder / f"{call_id.replace('@', '_')}.json").read_text())


def _trunk(tmp_path, port: int, code: int):
    """The trunk scenario: a 401 has its digest verified by SIPp (user 7001, `password`); SIPp's verifyauth
    reads only `Authorization`, so for a 407 an ereg checks our `Proxy-Authorization` answers the challenge
    (digest, user, realm, nonce, a 32-hex MD5 response); both headers come from aiosipua's same digest code."""
    if code == 401:
        verify = f'<verifyauth assign_to="authvalid" username="7001" password="{PASSWORD}"/>'
        branch = '<nop hide="true" test="authvalid" next="good"/>'
        phrase, challenge = "Unauthorized", "WWW-Authenticate"
    else:
        verify = (
            '<ereg regexp="^ *Digest .*username=&quot;7001&quot;.*realm=&quot;trunk.test&quot;.*'
            'nonce=&quot;a1b2c3d4e5f60718&quot;.*response=&quot;[0-9a-f]{32}&quot;" search_in="hdr" '
            'header="Proxy-Authorization:" check_it="true" assign_to="proxyauth"/>'
        )
        branch = '<nop hide="true" next="good"/><Reference variables="proxyauth"/>'
        phrase, challenge = "Proxy Authentication Required", "Proxy-Authenticate"
    return scenario("trunk_proxy", tmp_path, RURI_RE=r"sip:\+15551234567@trunk\.example", PORT=port, CODE=code,
                    PHRASE=phrase, CHALLENGE=challenge, VERIFY=verify, BRANCH=branch)  # fmt: skip


def _metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return -1.0


@pytest.mark.parametrize("code", [401, 407])
async def test_dial_through_an_outbound_proxy_that_challenges(tmp_path, code, caplog):
    caplog.set_level(logging.DEBUG)  # every line, aiosipua's included: the password is in none of them
    proxy_port = free_udp_port()
    path = _trunk(tmp_path, proxy_port, code)
    settings = dict(outbound_proxy=f"127.0.0.1:{proxy_port}", user="7001", register_password=PASSWORD)
    async with checked_endpoint(short, **settings) as ep:
        trunk = asyncio.create_task(
            run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=proxy_port, name="trunk")
        )
        await udp_bound(proxy_port)
        result = await ep.dial(CALLEE, ring_timeout_s=20)
        assert (result.outcome, result.status) == ("answered", 200), result
        assert result.proxy == f"127.0.0.1:{proxy_port}"
        got = await trunk
        await wait_for(lambda: result.call_id in ep.finished, what="the placed call to finish")
    # SIPp checked the Request-URI and Route of both INVITEs, our digest answer, and the Route of our BYE
    assert got.rc == 0, got.output + got.errors
    assert got.count("Successful call") == 1
    assert "via 127.0.0.1:" in caplog.text and PASSWORD not in caplog.text


async def test_wrong_trunk_password_is_a_failed_call_with_the_trunks_answer(tmp_path):
    proxy_port = free_udp_port()
    path = _trunk(tmp_path, proxy_port, 401)  # SIPp computes the digest of a 401's answer itself
    settings = dict(outbound_proxy=f"127.0.0.1:{proxy_port}", user="7001", register_password="wrong")
    async with checked_endpoint(short, **settings) as ep:
        trunk = asyncio.create_task(
            run_sipp("", tmp_path, "-sf", str(path), "-m", "1", port=proxy_port, name="trunk")
        )
        await udp_bound(proxy_port)
        result = await ep.dial(CALLEE, ring_timeout_s=20)
        await trunk
        assert ep.free_slots == 4 and not ep.calls
    assert (result.outcome, result.status, result.reason) == ("failed", 403, "Forbidden"), result


async def test_every_dial_outcome_is_returned_counted_and_recorded(tmp_path):
    records = tmp_path / "calls"
    metrics = ServeMetrics(engine=None, transports=("sip",))
    outcomes = []
    async with checked_endpoint(short) as ep:
        record = dial_outcome(SimpleNamespace(record_dir=records), metrics)
        ep.on_dial = lambda result: (outcomes.append(result), record(result))

        async def against(name: str, uri_user: str = "service", **values) -> tuple:
            port = free_udp_port()
            sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(scenario(name, tmp_path, **values)),
                                                "-m", "1", port=port, name=name))  # fmt: skip
            await udp_bound(port)
            result = await ep.dial(f"sip:{uri_user}@127.0.0.1:{port}", ring_timeout_s=2)
            return result, await sipp

        rang, cancelled = await against("callee_rings")
        busy, declined = await against("callee_refuses", CODE=603, PHRASE="Decline")
        missing, not_found = await against("callee_refuses", CODE=404, PHRASE="Not Found")
        silent = await ep.dial(f"sip:nobody@127.0.0.1:{free_udp_port()}", ring_timeout_s=2)
        unresolved = await ep.dial("sip:nobody@no-such-host.invalid", ring_timeout_s=2)
        assert ep.free_slots == 4 and not ep.calls and not ep.answering
    assert (rang.outcome, rang.status) == ("no-answer", None) and "CANCEL sent" in rang.reason
    assert cancelled.rc == 0, cancelled.output + cancelled.errors  # SIPp got our CANCEL and answered 487
    for sipp in (declined, not_found):  # callee_refuses.xml requires the ACK of its 603 / 404
        assert sipp.rc == 0, sipp.output + sipp.errors
    assert (busy.outcome, busy.status) == ("busy", 603)
    assert (missing.outcome, missing.status, missing.reason) == ("failed", 404, "Not Found")
    assert (silent.outcome, silent.status) == ("failed", None) and "no response" in silent.reason
    assert unresolved.outcome == "failed" and "unreachable" in unresolved.reason
    assert [r.outcome for r in outcomes] == ["no-answer", "busy", "failed", "failed", "failed"]
    for result in (rang, busy, missing, silent):
        rec = _record(records, result.call_id)
        meta = rec["meta"]
        assert (
            rec["complete"] is True and rec["frames"] == [] and rec["summary"]["ended_by"] == result.outcome
        )
        assert (meta["transport"], meta["direction"], meta["outcome"]) == ("sip", "outbound", result.outcome)
        assert meta["sip_status"] == result.status and meta["dial"]["to"] == result.uri
    assert len(list(records.glob("dial-*.json"))) == 1  # the unresolvable one: no INVITE, no Call-ID
    text = metrics.render().decode()
    for outcome, n in (("no-answer", 1), ("busy", 1), ("failed", 3), ("answered", 0)):
        assert _metric(text, f'duetaspan_sip_dial_total{{outcome="{outcome}"}}') == n, outcome


async def test_a_cancelled_dial_cancels_its_ringing_invite(tmp_path):
    """A dial cancelled while it rings (a campaign's scheduler gave up on it, the server stops) CANCELs its
    INVITE: the callee (which fails its call without a CANCEL) gets one and answers 487, and no dialog, port or
    slot is left (`checked_endpoint`), so a retry never dials a number whose earlier call still rings."""
    port = free_udp_port()
    sipp = asyncio.create_task(run_sipp("", tmp_path, "-sf", str(scenario("callee_rings", tmp_path)), "-m", "1",
                                        port=port, name="rings"))  # fmt: skip
    await udp_bound(port)
    async with checked_endpoint(short) as ep:
        dial = asyncio.create_task(ep.dial(f"sip:service@127.0.0.1:{port}", ring_timeout_s=60))
        uac = ep.uas.uac
        await wait_for(lambda: any(c.dialog.remote_tag for c in uac._calls.values()), what="the callee's 180")
        dial.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dial
        rang = await asyncio.wait_for(sipp, 60)
    assert rang.rc == 0, rang.output + rang.errors  # SIPp got our CANCEL (and our ACK of its 487)
