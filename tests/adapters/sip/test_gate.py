"""`SipGate`: the allow-list (loopback only by default), digest verification against credentials computed by
aiosipua's own client code (right, wrong password, wrong user, stale and forged nonces), per-source rate
limits. The end-to-end counterparts with SIPp are in test_endpoint_sipp.py."""

from __future__ import annotations

from aiosipua.auth import SipDigestAuth, build_credentials
from aiosipua.headers import parse_auth, stringify_auth
from aiosipua.message import SipRequest

from duetaspan.adapters.sip.gate import NONCE_TTL_S, SipGate


def _invite(authorization: str | None = None) -> SipRequest:
    req = SipRequest(method="INVITE", uri="sip:agent@127.0.0.1")
    if authorization:
        req.headers.set_single("Authorization", authorization)
    return req


def _answer(
    gate: SipGate, user: str, password: str, *, now: float | None = None, nonce: str | None = None
) -> str:
    challenge = parse_auth(gate.challenge_header(now))
    if nonce is not None:
        challenge.params["nonce"] = nonce
    creds = build_credentials(SipDigestAuth(user, password), challenge, "INVITE", "sip:agent@127.0.0.1")
    assert creds is not None
    return stringify_auth(creds)


def test_loopback_only_without_allow_or_credentials():
    gate = SipGate(allow=[], auth_user=None, auth_password=None)
    assert gate.check(_invite(), "127.0.0.1") == "allow"
    assert gate.check(_invite(), "192.0.2.10") == "refuse"
    assert gate.source_allowed("::1") and not gate.source_allowed("not-an-ip")


def test_allow_list_replaces_loopback():
    gate = SipGate(allow=["10.0.0.0/8", "192.0.2.7"], auth_user=None, auth_password=None)
    assert gate.check(_invite(), "10.9.8.7") == "allow"
    assert gate.check(_invite(), "192.0.2.7") == "allow"
    assert gate.check(_invite(), "127.0.0.1") == "refuse"


def test_digest_right_wrong_and_unknown_user():
    gate = SipGate(allow=["10.0.0.0/8"], auth_user="trunk", auth_password="s3cret")
    assert gate.check(_invite(), "192.0.2.1") == "challenge"
    assert gate.check(_invite(_answer(gate, "trunk", "s3cret")), "192.0.2.1") == "allow"
    assert gate.check(_invite(_answer(gate, "trunk", "guess")), "192.0.2.1") == "refuse"
    assert gate.check(_invite(_answer(gate, "admin", "s3cret")), "192.0.2.1") == "refuse"
    options = SipRequest(method="OPTIONS", uri="sip:agent@127.0.0.1")
    assert gate.check(options, "192.0.2.1") == "refuse"  # only INVITEs are challenged


def test_stale_and_forged_nonces_are_refused():
    gate = SipGate(allow=[], auth_user="trunk", auth_password="s3cret")
    import time

    stale = _answer(gate, "trunk", "s3cret", now=time.time() - NONCE_TTL_S - 5)
    assert gate.check(_invite(stale), "192.0.2.1") == "refuse"
    other = SipGate(allow=[], auth_user="trunk", auth_password="s3cret")  # another process's secret
    forged = _answer(gate, "trunk", "s3cret", nonce=other._nonce())
    assert gate.check(_invite(forged), "192.0.2.1") == "refuse"
    assert gate.check(_invite("Digest garbage"), "192.0.2.1") == "refuse"


def test_rate_limit_per_source():
    gate = SipGate(allow=[], auth_user=None, auth_password=None, rate_per_s=2.0)
    verdicts = [gate.within_rate("127.0.0.1", now=100.0) for _ in range(10)]
    assert verdicts.count(True) == 8  # a burst of 4x the rate
    assert gate.within_rate("127.0.0.2", now=100.0)  # other sources are unaffected
    assert gate.within_rate("127.0.0.1", now=101.0)  # refilled at 2 per second
    assert repr(gate).count("s3cret") == 0
