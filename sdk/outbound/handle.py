"""`agent.campaign(...)`: a campaign from Python on a serving agent's store, and the handle it returns.

Example:
    >>> # campaign = await agent.campaign("contacts.csv", name="reminders", max_concurrent=4)
    >>> # await campaign.wait()              # until every number is done
    >>> # (await campaign.status())["counts"]  # {'answered': 80, 'busy': 12, 'dnc': 3, ...}
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from duetaspan.config.base import format_errors
from duetaspan.config.store import CampaignConfig
from duetaspan.errors import ConfigError
from duetaspan.outbound.contacts import contacts_from_rows, parse_contacts
from duetaspan.outbound.scheduler import effective_settings
from duetaspan.outbound.status import campaign_status, export_csv
from duetaspan.store.db import Store


class CampaignExists(ConfigError):
    """A campaign of that name exists already."""


# what a campaign may set for itself (the rest of `[campaign]` is the server's: reserve_inbound, lease_s, poll_s)
SETTING_KEYS = frozenset({"max_concurrent", "calls_per_minute", "window", "days", "max_attempts", "retry",
                          "ring_timeout_s"})  # fmt: skip


def check_settings(config: CampaignConfig, overrides: dict[str, Any]) -> CampaignConfig:
    """The settings a campaign with `overrides` runs with; `ConfigError` naming an unknown key or a bad value."""
    unknown = sorted(set(overrides) - SETTING_KEYS)
    if unknown:
        raise ConfigError(f"campaign settings {unknown}: a campaign sets only {', '.join(sorted(SETTING_KEYS))}")
    try:
        return effective_settings(config, overrides)
    except ValidationError as exc:
        raise ConfigError(f"campaign settings: {format_errors(exc)}") from None


async def create_campaign(
    store: Store, config: CampaignConfig, name: str | None, contacts: list[dict[str, Any]], overrides: dict[str, Any]
) -> dict[str, Any]:
    """Validate the settings, write the campaign and its contacts (one transaction, with its outbox event);
    its status."""
    check_settings(config, overrides)  # a bad value fails here, before anything is written
    name = name or time.strftime("campaign-%Y%m%d-%H%M%S", time.gmtime())
    async with store.transaction() as tx:
        if await tx.campaign(name) is not None:
            raise CampaignExists(f"a campaign named {name!r} exists: choose another name")
        camp = await tx.create_campaign(name, overrides, contacts, now=store.clock.now())
        await tx.emit("campaign.started", data={"campaign_id": camp.id, "name": name, "contacts": len(contacts)})
        return await campaign_status(tx, camp)


class CampaignHandle:
    """One campaign on a store: `status()`, `wait()`, `pause()`, `resume()`, `cancel()`, `export()`."""

    def __init__(self, store: Store, name: str, wake: Any = None) -> None:
        self.store, self.name, self._wake = store, name, wake

    async def status(self) -> dict[str, Any]:
        # one snapshot: on PostgreSQL the counts and the attempts are otherwise read at two moments, and a claim
        # between them shows an attempt whose contact is not `dialling` yet
        async with self.store.transaction(snapshot=True) as tx:
            camp = await tx.campaign(self.name)
            if camp is None:
                raise ConfigError(f"no campaign {self.name!r}")
            return await campaign_status(tx, camp)

    async def _set(self, state: str) -> dict[str, Any]:
        async with self.store.transaction() as tx:
            camp = await tx.campaign(self.name)
            if camp is None:
                raise ConfigError(f"no campaign {self.name!r}")
            if camp.state != "done":
                await tx.set_campaign_state(camp.id, state)
                await tx.emit(f"campaign.{state}", data={"campaign_id": camp.id, "name": self.name})
        if state == "running" and self._wake is not None:
            self._wake()
        return await self.status()

    async def pause(self) -> dict[str, Any]:
        return await self._set("paused")

    async def resume(self) -> dict[str, Any]:
        return await self._set("running")

    async def cancel(self) -> dict[str, Any]:
        return await self._set("cancelled")

    async def export(self) -> str:
        async with self.store.transaction(snapshot=True) as tx:
            camp = await tx.campaign(self.name)
            if camp is None:
                raise ConfigError(f"no campaign {self.name!r}")
            return await export_csv(tx, camp)

    async def wait(self, *, poll_s: float = 0.5, timeout_s: float | None = None) -> dict[str, Any]:
        """Until the campaign is done or cancelled; its last status."""
        deadline = None if timeout_s is None else asyncio.get_running_loop().time() + timeout_s
        while True:
            status = await self.status()
            if status["state"] in ("done", "cancelled"):
                return status
            if deadline is not None and asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"campaign {self.name}: not done after {timeout_s} s: {status['counts']}")
            await asyncio.sleep(poll_s)


async def start_campaign(agent: Any, contacts: Any, *, name: str | None = None, **settings: Any) -> CampaignHandle:
    """`agent.campaign(contacts, name=..., max_concurrent=...)`: contacts as a CSV path, CSV text or a list of
    dicts (`{"to": ..., "name": ...}`); the agent must be serving (its store and scheduler run with it)."""
    store = getattr(agent, "store", None)
    if store is None:
        raise ConfigError("agent.campaign needs a serving agent: run agent.serve(sip=True and/or twilio=True) first")
    if isinstance(contacts, list):
        rows = contacts_from_rows(contacts)
    elif isinstance(contacts, Path) or (isinstance(contacts, str) and "\n" not in contacts):
        rows = parse_contacts(await asyncio.to_thread(Path(contacts).read_text, encoding="utf-8"))
    else:
        rows = parse_contacts(str(contacts))
    status = await create_campaign(store, agent.config.campaign, name, rows, settings)
    wake = getattr(getattr(agent, "campaigns", None), "wake", None)
    if wake is not None:
        wake()
    return CampaignHandle(store, status["name"], wake)


__all__ = ["SETTING_KEYS", "CampaignExists", "CampaignHandle", "check_settings", "create_campaign", "start_campaign"]
