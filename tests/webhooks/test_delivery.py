"""The outbox deliverer on both stores with a real HTTP receiver: signed bodies, the same id on every retry,
5xx / 408 / 429 / timeout / refused retried with backoff, a TLS error (a receiver whose certificate we do not
trust) retried and counted as `tls`, other 4xx a dead letter with its last answer, the retry window, replay,
several URLs."""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import time

import pytest

from duetaspan.webhooks.delivery import Deliverer, backoff, replay
from tests.webhooks.conftest import SECRET, Receiver


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def _emit(store, type_="call.ended", call_id="CA1", data=None):
    async with store.transaction() as tx:
        return await tx.emit(type_, call_id=call_id, data=data or {"outcome": "completed"})


async def _events(store, **kw):
    async with store.transaction() as tx:
        return await tx.events(**kw)


def _deliverer(store, urls, clock, **kw):
    return Deliverer(store, urls, [SECRET], clock=clock, timeout_s=kw.pop("timeout_s", 5.0), **kw)


async def _drain(d: Deliverer, clock: Clock, rounds: int = 10, step_s: float = 7200.0) -> None:
    for _ in range(rounds):
        await d.run_once()
        clock.now += step_s


async def test_signed_delivery_then_the_same_id_after_5xx_408_429(store, receiver):
    r = await receiver([503, 408, 429, 200])
    clock = Clock()
    event = await _emit(store, data={"outcome": "completed", "turns": []})
    clock.now = event.created
    d = _deliverer(store, [r.url], clock)
    states = []
    for _ in range(4):
        await d.run_once()
        [row] = await _events(store)
        states.append(row.state)
        clock.now = row.next_attempt_at + 0.001
    await d.aclose()
    assert states == ["pending", "pending", "pending", "delivered"]
    assert [g["status"] for g in r.got] == [503, 408, 429, 200] and r.bad_signatures == 0
    assert {g["event"]["id"] for g in r.got} == {event.id} and len({g["body"] for g in r.got}) == 1
    body = r.got[0]["event"]
    assert set(body) == {"id", "type", "created", "call_id", "data"} and body["type"] == "call.ended"
    assert body["created"] == int(event.created) and body["call_id"] == "CA1"
    [row] = await _events(store)
    assert row.attempts == 4 and json.loads(row.last_answer)["done"] == [r.url]
    assert d.stats.delivered == 1 and d.stats.by_reason == {"http_5xx": 1, "http_4xx": 2}
    # what /metrics shows of it (`serve` registers this collector: duetaspan.webhooks.served)
    from prometheus_client import CollectorRegistry, generate_latest

    from duetaspan.webhooks.served import WebhookCollector

    registry = CollectorRegistry()
    registry.register(WebhookCollector(d.stats))
    text = generate_latest(registry).decode()
    assert 'duetaspan_webhook_failures_total{reason="http_5xx"} 1.0' in text, text
    assert 'duetaspan_webhook_failures_total{reason="http_4xx"} 2.0' in text, text
    assert "duetaspan_webhook_delivered_total 1.0" in text, text


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
async def test_other_4xx_is_a_dead_letter_with_its_last_answer(store, receiver, status):
    r = await receiver([status])
    await _emit(store)
    clock = Clock()
    d = _deliverer(store, [r.url], clock)
    await _drain(d, clock, rounds=3)
    await d.aclose()
    [row] = await _events(store)
    assert row.state == "dead" and row.attempts == 1 and len(r.got) == 1
    assert json.loads(row.last_answer)["answers"][r.url] == f"{status} answer {status}"


async def test_refused_and_timeout_retry_until_the_window_ends_then_replay(store, receiver):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    clock = Clock()
    await _emit(store)
    clock.now += 1
    d = _deliverer(store, [closed], clock, retry_for_s=600.0, max_backoff_s=120.0)
    for _ in range(30):
        await d.run_once()
        [row] = await _events(store)
        if row.state != "pending":
            break
        clock.now = row.next_attempt_at + 0.001
    [row] = await _events(store)
    await d.aclose()
    assert row.state == "dead" and row.attempts >= 4 and "connect" in row.last_answer.lower()
    assert 600 - 120 <= clock.now - row.created <= 600 + 120
    assert d.stats.by_reason.get("connection", 0) == row.attempts
    hanging = await receiver(["hang"])
    d2 = _deliverer(store, [hanging.url], clock, timeout_s=0.3)
    assert await replay(store, [row.id]) == 1
    await d2.run_once()
    [row] = await _events(store)
    assert row.state == "pending" and "timeout" in row.last_answer and d2.stats.by_reason == {"timeout": 1}
    await d2.aclose()
    good = await receiver()
    assert await replay(store, dead=True) == 0  # nothing dead now
    d3 = _deliverer(store, [good.url], clock)
    clock.now = row.next_attempt_at + 1
    await d3.run_once()
    await d3.aclose()
    assert [g["event"]["id"] for g in good.got] == [row.id] and (await _events(store))[0].state == "delivered"


def _self_signed(folder) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as PEM files in `folder`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "duetaspan test receiver")])
    now, day = datetime.datetime.now(datetime.UTC), datetime.timedelta(days=1)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    loopback = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - day).not_valid_after(now + day)
        .add_extension(loopback, False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        .add_extension(ski, False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = folder / "receiver.crt", folder / "receiver.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return str(cert_path), str(key_path)


async def _https_receiver(receiver: Receiver, cert: str, key: str) -> str:
    """`receiver` served over HTTPS on loopback with that certificate; its URL."""
    from aiohttp import web

    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post("/hook", receiver._handle)
    receiver._runner = web.AppRunner(app)
    await receiver._runner.setup()
    site = web.TCPSite(receiver._runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    receiver.url = f"https://127.0.0.1:{port}/hook"
    return receiver.url


async def test_a_tls_error_is_retried_counted_as_tls_then_delivered_once_trusted(store, tmp_path):
    cert, key = _self_signed(tmp_path)
    r = Receiver()
    try:
        url = await _https_receiver(r, cert, key)
        event = await _emit(store)
        clock = Clock()
        clock.now = event.created
        d = _deliverer(store, [url], clock)  # the system's trust: a self-signed certificate is not in it
        await d.run_once()
        await d.aclose()
        [row] = await _events(store)
        assert row.state == "pending" and row.attempts == 1 and row.next_attempt_at > clock.now  # not dead
        answer = json.loads(row.last_answer)["answers"][url]
        assert answer.startswith("TLS error") and "certificate" in answer.lower(), answer
        assert d.stats.by_reason == {"tls": 1} and d.stats.dead == 0 and r.got == []
        # the same event, once the receiver's certificate is trusted: delivered, its id unchanged
        trusted = _deliverer(store, [url], clock, ssl_context=ssl.create_default_context(cafile=cert))
        clock.now = row.next_attempt_at + 0.001
        await trusted.run_once()
        await trusted.aclose()
    finally:
        await r.stop()
    [row] = await _events(store)
    assert row.state == "delivered" and [g["event"]["id"] for g in r.got] == [event.id]
    assert r.bad_signatures == 0 and trusted.stats.by_reason == {}


async def test_each_url_gets_each_event_once_it_answered(store, receiver):
    ok, flaky = await receiver(), await receiver([500, 500])
    first = await _emit(store, call_id="CA1")
    second = await _emit(store, "call.started", call_id="CA2", data={"transport": "twilio", "started_at": 1.0})
    clock = Clock()
    d = _deliverer(store, [ok.url, flaky.url], clock)
    await _drain(d, clock, rounds=4)
    await d.aclose()
    assert sorted(g["event"]["id"] for g in ok.got) == sorted([first.id, second.id])  # once each
    assert sorted(g["event"]["id"] for g in flaky.got if g["status"] == 200) == sorted([first.id, second.id])
    assert {e.state for e in await _events(store)} == {"delivered"}


async def test_wrong_secret_is_refused_by_the_receiver_and_dead_lettered(store, receiver):
    r = await receiver(secret="another")
    await _emit(store)
    clock = Clock()
    d = _deliverer(store, [r.url], clock)
    await d.run_once()
    await d.aclose()
    assert r.bad_signatures == 1 and (await _events(store))[0].state == "dead"


def test_backoff_grows_exponentially_with_jitter_and_a_cap():
    assert [backoff(n, max_s=60, rand=lambda: 1.0) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff(3, max_s=60, rand=lambda: 0.0) == 4.0
    with pytest.raises(ValueError, match="secret"):
        Deliverer(None, ["http://x"], [])
