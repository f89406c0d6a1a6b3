"""Draining and access roles of a Ray Serve deployment, the same rules as one `duetaspan serve` process
(`duetaspan.drain`, `duetaspan.access`).

- A replica drains (`ReplicaDrain`) when Ray Serve stops it (scale-down, redeploy, `serve delete`): Serve
  calls no hook before it waits for a stopping replica's requests, so the replica watches its own state in
  the Serve controller and, once it reads `STOPPING` or is no longer listed, starts the drain of its agent's
  `Admission`: new calls
  are refused (`draining`), the replica's `/health` answers 503, the live calls go on, and at
  `drain_timeout_s` what is left is ended the way a hang-up ends a call (records with
  `ended_by: "shutdown"`), before Serve's `graceful_shutdown_timeout_s` (`drain_timeout_s` +
  `SHUTDOWN_MARGIN_S`) kills the replica.
- `POST /admin/drain` on the ingress (admin role) drains the whole deployment (`DeploymentDrain`): the
  ingress stops placing calls (Twilio: the drain TwiML, WebRTC offers: 503, `/health` 503) and posts
  `/admin/drain` to every replica's relay endpoint (the address each announces for its `/metrics`), with a
  token derived from the deployment's key, which only the ingress and the replicas hold.
- `roles(config)`: the metrics and admin roles; a role without its token is refused (403) unless the
  deployment is the local demo (Serve's proxy on loopback and no public URL).

Example:
    >>> token = control_token(b"k" * 32)
    >>> len(token)
    64
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Callable
from typing import Any

from duetaspan.access import ADMIN_TOKEN_ENV, BearerRole
from duetaspan.drain import END_GRACE_S, Drain
from duetaspan.observability.metrics import TOKEN_ENV as METRICS_TOKEN_ENV
from duetaspan.pipeline.admission import Admission

logger = logging.getLogger("duetaspan.ray")

DRAIN_PATH = "/admin/drain"
STATE_POLL_S = 1.0  # how often a replica reads its own state in the Serve controller
# Serve's graceful_shutdown_timeout_s = drain_timeout_s + this: the records of the calls the drain ends are
# written (END_GRACE_S at most) and the replica exits before Serve kills it
SHUTDOWN_MARGIN_S = END_GRACE_S + 15.0
STOPPING = "STOPPING"
MISSING_READS = 2  # a replica the controller stops listing drains at the second such read (not on a glitch)


def control_token(key: bytes) -> str:
    """The bearer token of the replicas' `/admin/drain`, derived from the deployment's sealing key."""
    return hmac.new(key, b"duetaspan-replica-drain", hashlib.sha256).hexdigest()


def roles(config: Any) -> tuple[BearerRole, BearerRole]:
    """The deployment's metrics and admin roles (`duetaspan.access`): open without a token only on the local
    demo (`config.local_demo`), as on one process."""
    metrics = BearerRole(
        "metrics", config.metrics_bearer, METRICS_TOKEN_ENV, open_without_token=config.local_demo
    )
    admin = BearerRole("admin", config.admin_bearer, ADMIN_TOKEN_ENV, open_without_token=config.local_demo)
    return metrics, admin


def serve_replica_state(app_name: str, deployment: str, replica_id: str) -> str | None:
    """This replica's state in the Serve controller (`RUNNING`, `STOPPING`, ...), None when not listed.
    Blocking (a controller call): run it in a thread."""
    from ray.serve.context import _get_global_client

    client = _get_global_client()
    if client is None:
        return None
    details = client.get_serve_details()
    app = (details.get("applications") or {}).get(app_name) or {}
    replicas = ((app.get("deployments") or {}).get(deployment) or {}).get("replicas") or []
    for replica in replicas:
        if replica.get("replica_id") == replica_id:
            return str(replica.get("state"))
    return None


class ReplicaDrain:
    """The drain of one engine replica (see the module docstring). `begin(reason)` starts it (idempotent);
    `watch()` starts it when Serve stops the replica."""

    def __init__(self, name: str, admission: Admission, timeout_s: float) -> None:
        self.name = name
        self.drain = Drain(admission, stop=self._drained, timeout_s=timeout_s)
        self.drained = asyncio.Event()

    @property
    def draining(self) -> bool:
        return self.drain.draining

    @property
    def state(self) -> str:
        return self.drain.state

    def begin(self, reason: str) -> bool:
        started = self.drain.begin(f"replica {self.name}: {reason}")
        if started:
            logger.warning("replica %s draining (%s): no new calls", self.name, reason)
        return started

    def _drained(self, force: bool) -> None:
        logger.warning("replica %s drained: no live calls left", self.name)
        self.drained.set()

    async def watch(self, state: Callable[[], str | None], poll_s: float = STATE_POLL_S) -> None:
        """Drain once `state()` (the replica's Serve state, read in a thread) says `STOPPING`, or the replica
        is no longer listed (`MISSING_READS` reads in a row) after it was: a stopping replica leaves the
        controller's list at once (Ray 2.60). A controller that cannot be reached drains nothing."""
        seen, missing = False, 0
        while not self.draining:
            try:
                now = await asyncio.to_thread(state)
            except Exception as exc:
                logger.debug("replica %s: Serve state unknown: %r", self.name, exc)
            else:
                missing = missing + 1 if now is None and seen else 0
                if now == STOPPING or missing >= MISSING_READS:
                    self.begin(f"Ray Serve is stopping it ({now or 'no longer listed'})")
                    return
                seen = seen or now is not None
            await asyncio.sleep(poll_s)


class IngressAdmission(Admission):
    """The ingress's admission: no slots of its own (calls run on replicas), its draining flag, and the
    count of calls it holds placed (`held`, what `POST /admin/drain` reports)."""

    def __init__(self, held: Callable[[], int]) -> None:
        super().__init__(0)
        self._held = held

    @property
    def held(self) -> int:
        return self._held()


class DeploymentDrain:
    """`POST /admin/drain` on the ingress (as `app.state.drain`): refuse new calls here and drain every
    replica (`notify(reason)` posts their `/admin/drain`)."""

    def __init__(self, admission: IngressAdmission, notify: Callable[[str], Any], timeout_s: float) -> None:
        self.admission = admission
        self.notify = notify
        self.timeout_s = timeout_s
        self.replicas: dict[str, int] = {}  # replica -> HTTP status of its /admin/drain
        self.on_state: list[Callable[[str], object]] = []  # the ingress's `duetaspan_draining` gauge
        self._task: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.admission.draining

    def begin(self, reason: str) -> bool:
        if not self.admission.start_drain(reason):
            return False
        for callback in self.on_state:
            callback("draining")
        logger.warning(
            "deployment draining (%s): no new calls; %d live call(s) get %.0f s to end",
            reason,
            self.admission.held,
            self.timeout_s,
        )
        self._task = asyncio.get_running_loop().create_task(self._notify(reason), name="duetaspan-drain")
        return True

    async def _notify(self, reason: str) -> None:
        try:
            self.replicas = await self.notify(reason)
        except Exception:
            logger.exception("draining the replicas failed")


async def drain_replicas(targets: dict[str, str], token: str, reason: str) -> dict[str, int]:
    """POST `/admin/drain` to every replica in `targets` (name -> host:port); name -> HTTP status (0: not
    reached)."""
    import aiohttp

    out: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:

        async def one(name: str, address: str) -> None:
            try:
                async with http.post(
                    f"http://{address}{DRAIN_PATH}", headers=headers, json={"reason": reason}
                ) as r:
                    out[name] = r.status
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                logger.error("replica %s (%s): drain not delivered: %r", name, address, exc)
                out[name] = 0

        await asyncio.gather(*(one(n, a) for n, a in targets.items()))
    logger.warning("drain delivered to replicas: %s", out)
    return out


__all__ = [
    "DRAIN_PATH",
    "SHUTDOWN_MARGIN_S",
    "DeploymentDrain",
    "IngressAdmission",
    "ReplicaDrain",
    "control_token",
    "drain_replicas",
    "roles",
    "serve_replica_state",
]
