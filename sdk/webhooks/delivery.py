"""The webhook deliverer: claims due events from the store's outbox, POSTs each, signed, to every configured
URL, and records the answer.

At least once: an event is marked delivered only after every URL answered 2xx, so a process killed mid-way
sends it again after restart (its `id` is stable: receivers de-duplicate on it). Per URL:

    2xx                                         delivered (that URL is not sent the event again)
    5xx, 408, 429, timeout, refused, TLS error  retried: exponential backoff with full jitter
                                                (`min(max_backoff_s, 2 ** attempts)` s, times a random
                                                0.5..1), until `[webhooks] retry_for_s` after the event
    any other answer (4xx, 3xx)                 a dead letter, kept with its last answer

The outbox row's `last_answer` holds, as JSON, each URL's last answer and which URLs already took the event.
`duetaspan webhooks replay` puts dead (or delivered) events back to pending.

Example:
    >>> backoff(0, max_s=3600, rand=lambda: 1.0), backoff(10, max_s=60, rand=lambda: 0.0)
    (1.0, 30.0)
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from duetaspan.webhooks.events import webhook_body
from duetaspan.webhooks.signing import HEADER, signature_header

log = logging.getLogger(__name__)
RETRY_STATUSES = frozenset({408, 429})
USER_AGENT = "duetaspan-webhooks/1"


def backoff(attempts: int, *, max_s: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds before try `attempts + 1`: `min(max_s, 2 ** attempts)`, times a random 0.5..1 (jitter)."""
    return min(max_s, 2.0 ** min(attempts, 40)) * (0.5 + 0.5 * rand())


@dataclass
class Answer:
    """One URL's answer to one delivery."""

    ok: bool
    retry: bool
    text: str


@dataclass
class DeliveryStats:
    """Counters the `/metrics` route reads."""

    delivered: int = 0
    failed_attempts: int = 0
    dead: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    backlog: int = 0  # pending events in the outbox (all servers), at the last count
    dead_letters: int = 0  # dead events in the outbox, at the last count

    def failed(self, reason: str) -> None:
        self.failed_attempts += 1
        self.by_reason[reason] = self.by_reason.get(reason, 0) + 1


def _progress(last_answer: str | None) -> dict[str, Any]:
    try:
        parsed = json.loads(last_answer or "{}")
    except json.JSONDecodeError:
        parsed = {}
    return parsed if isinstance(parsed, dict) else {}


class Deliverer:
    """Delivers the outbox of `store` (a `duetaspan.store` store) to `urls`, signed with `secrets`."""

    def __init__(
        self,
        store: Any,
        urls: Sequence[str],
        secrets: Sequence[str],
        *,
        retry_for_s: float = 86400.0,
        timeout_s: float = 10.0,
        max_backoff_s: float = 3600.0,
        poll_s: float = 1.0,
        wants: Callable[[str], bool] = lambda _type: True,
        ssl_context: ssl.SSLContext | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if urls and not secrets:
            raise ValueError("webhooks need a signing secret: set DUETASPAN_WEBHOOK_SECRET")
        self.store = store
        self.urls = list(urls)
        self.secrets = list(secrets)
        self.retry_for_s = retry_for_s
        self.timeout_s = timeout_s
        self.max_backoff_s = max_backoff_s
        self.poll_s = poll_s
        self.wants = wants
        self.ssl_context = ssl_context
        self.clock = clock
        self.stats = DeliveryStats()
        self._wake = asyncio.Event()
        self._session: aiohttp.ClientSession | None = None

    def wake(self) -> None:
        """A new event is in the outbox: deliver now rather than at the next poll."""
        self._wake.set()

    async def _post(self, url: str, body: bytes) -> Answer:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"User-Agent": USER_AGENT})
        headers = {"Content-Type": "application/json", HEADER: signature_header(body, self.secrets)}
        try:
            async with self._session.post(
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                allow_redirects=False,
                ssl=self.ssl_context if self.ssl_context is not None else True,
            ) as resp:
                text = (await resp.text(errors="replace"))[:500]
                answer = f"{resp.status} {text}".strip()
                if 200 <= resp.status < 300:
                    return Answer(True, False, answer)
                retry = resp.status >= 500 or resp.status in RETRY_STATUSES
                self.stats.failed(f"http_{resp.status // 100}xx" if retry else "http_rejected")
                return Answer(False, retry, answer)
        except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
            self.stats.failed("tls")
            return Answer(False, True, f"TLS error: {exc}")
        except TimeoutError:
            self.stats.failed("timeout")
            return Answer(False, True, f"timeout after {self.timeout_s:g} s")
        except (aiohttp.ClientError, OSError) as exc:
            self.stats.failed("connection")
            return Answer(False, True, f"{type(exc).__name__}: {exc}")

    async def deliver(self, event: Any) -> str:
        """Send one claimed event to the URLs that have not taken it; returns its new state."""
        progress = _progress(event.last_answer)
        done: list[str] = list(progress.get("done", []))
        answers: dict[str, str] = dict(progress.get("answers", {}))
        if not self.wants(event.type):
            done = list(self.urls)
        body = webhook_body(event.id, event.type, event.created, event.call_id, event.data)
        retry, dead = False, False
        for url in self.urls:
            if url in done:
                continue
            answer = await self._post(url, body)
            answers[url] = answer.text
            if answer.ok:
                done.append(url)
            elif answer.retry:
                retry = True
            else:
                dead = True
        last = json.dumps({"done": done, "answers": answers}, ensure_ascii=False)
        now = self.clock()
        async with self.store.transaction() as tx:
            if not dead and not retry:
                await tx.event_delivered(event.id, last)
                self.stats.delivered += 1
                return "delivered"
            retry_at = now + backoff(event.attempts, max_s=self.max_backoff_s)
            if dead or retry_at > event.created + self.retry_for_s:
                await tx.event_failed(event.id, last, retry_at=None)
                self.stats.dead += 1
                log.warning("webhook event %s (%s) is a dead letter: %s", event.id, event.type, answers)
                return "dead"
            await tx.event_failed(event.id, last, retry_at=retry_at)
            log.info("webhook event %s (%s): retry in %.1f s", event.id, event.type, retry_at - now)
            return "pending"

    async def run_once(self, *, limit: int = 50) -> int:
        """Deliver what is due now; returns how many events were tried."""
        async with self.store.transaction() as tx:
            events = await tx.claim_events(now=self.clock(), lease_s=self.timeout_s * (len(self.urls) + 1) + 5,
                                           limit=limit)  # fmt: skip
        for event in events:
            try:
                await self.deliver(event)
            except Exception:  # a store hiccup: the claim's lease ends and the event is tried again
                log.exception("webhook event %s: delivery bookkeeping failed", event.id)
        return len(events)

    async def count(self) -> None:
        """Refresh the outbox's pending and dead counts (`/metrics`)."""
        async with self.store.transaction() as tx:
            rows = await tx.fetchall("SELECT state, COUNT(*) AS n FROM outbox GROUP BY state")
        counts = {row["state"]: int(row["n"]) for row in rows}
        self.stats.backlog, self.stats.dead_letters = counts.get("pending", 0), counts.get("dead", 0)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until `stop` is set: at once when woken, else every `poll_s`."""
        try:
            while not stop.is_set():
                try:
                    tried = await self.run_once()
                    await self.count()
                except Exception:
                    log.exception("webhook delivery: cannot read the outbox")
                    tried = 0
                if tried:
                    continue
                self._wake.clear()
                waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
                await asyncio.wait(waiters, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
                for w in waiters:
                    w.cancel()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def replay(
    store: Any, event_ids: Sequence[str] = (), *, dead: bool = False, now: float | None = None
) -> int:
    """Put events back to pending, due now (by id, or every dead letter with `dead=True`); returns how many."""
    now = time.time() if now is None else now
    count = 0
    async with store.transaction() as tx:
        if dead:
            count += await tx.execute(
                "UPDATE outbox SET state = 'pending', next_attempt_at = ?, last_answer = NULL WHERE state = 'dead'",
                [now],
            )
        for event_id in event_ids:
            count += await tx.execute(
                "UPDATE outbox SET state = 'pending', next_attempt_at = ?, last_answer = NULL WHERE id = ?",
                [now, event_id],
            )
    return count


__all__ = ["Answer", "Deliverer", "DeliveryStats", "backoff", "replay"]
