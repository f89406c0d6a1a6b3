"""The outbox deliverer on both stores with a real HTTP receiver: signed bodies, the same id on every retry,
5xx / 408 / 429 / timeout / refused retried with backoff, other 4xx a dead letter with its last answer, the
retry window, replay, several URLs."""

from __future__ import annotations

import json
import socket
import time

import pytest

from duetaspan.webhooks.delivery import Deliverer, backoff, replay
from tests.webhooks.conftest import SECRET


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
