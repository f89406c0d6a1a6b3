"""The store and the campaign scheduler of one `serve` process: the data folder (`[server] data_dir`, made
whether or not recording is on), the store in it (or `[store] url`), a one-time index of an old record
folder, the admin routes (`duetaspan.outbound.api`), and the scheduler when this server can dial (SIP or
Twilio served)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from duetaspan.agent.dialing import dial_slots
from duetaspan.outbound.api import StoreRoutes
from duetaspan.outbound.scheduler import AgentDialer, CampaignRunner
from duetaspan.store import Clock, Store, index_folder, open_store, store_target

log = logging.getLogger("duetaspan.store")


class ServerStore:
    """Open with `await open()`, `mount(app)`, `start_campaigns()` once the agent is up, `await aclose()`."""

    def __init__(self, agent: Any, metrics: Any = None, *, can_dial: bool = False) -> None:
        self.agent, self.metrics, self.can_dial = agent, metrics, can_dial
        self.store: Store | None = None
        self.runner: CampaignRunner | None = None
        self.routes: StoreRoutes | None = None

    async def open(self) -> Store:
        cfg = self.agent.config
        data_dir = Path(cfg.server.data_dir)
        await asyncio.to_thread(data_dir.mkdir, mode=0o700, parents=True, exist_ok=True)
        target = store_target(cfg.store.url, cfg.store.path, data_dir)
        self.store = await open_store(target, clock=Clock(), server_id=cfg.store.server_id)
        log.info("store: %s (%s)", self.store.kind, target if self.store.kind == "sqlite" else "[store] url")
        self.agent.store = self.store
        record_dir = getattr(self.agent, "record_dir", None)
        if record_dir is not None:
            await index_folder(self.store, Path(record_dir))
        self.routes = StoreRoutes(self.store, cfg.campaign, wake=self._wake)
        return self.store

    def mount(self, app: FastAPI) -> None:
        if self.routes is not None:
            self.routes.mount(app)

    def _wake(self) -> None:
        if self.runner is not None:
            self.runner.wake()

    def start_campaigns(self) -> None:
        """Run the scheduler (only a server that serves SIP or Twilio can dial)."""
        if self.store is None or not self.can_dial or self.runner is not None:
            return
        metrics = None
        if self.metrics is not None:
            from duetaspan.observability.campaign_metrics import CampaignMetrics

            metrics = CampaignMetrics(self.metrics.registry)
        self.runner = CampaignRunner(self.store, AgentDialer(self.agent), self.agent.config.campaign,
                                     free_slots=lambda: dial_slots(self.agent), metrics=metrics,
                                     recover_own=bool(self.agent.config.store.server_id))
        self.runner.start()
        self.agent.campaigns = self.runner  # `agent.campaign(...)` wakes it

    async def stop_campaigns(self) -> None:
        """Stop the scheduler: nothing more is dialled (the store stays open for the calls' last writes)."""
        if self.runner is not None:
            await self.runner.stop()
            if getattr(self.agent, "campaigns", None) is self.runner:
                self.agent.campaigns = None
            self.runner = None

    async def aclose(self) -> None:
        await self.stop_campaigns()
        if self.store is not None:
            await self.store.close()
            if getattr(self.agent, "store", None) is self.store:
                self.agent.store = None
            self.store = None


__all__ = ["ServerStore"]
