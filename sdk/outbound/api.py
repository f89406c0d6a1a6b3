"""The admin API of the store and campaigns (admin role, `Authorization: Bearer $DUETASPAN_ADMIN_TOKEN`):

| route | does |
|---|---|
| `GET /admin/calls` | indexed calls, newest first: `since`, `until` (epoch seconds or ISO 8601), `outcome`, `number`, `campaign`, `transport`, `limit` |
| `POST /admin/campaigns` | start a campaign: `{"name", "csv": "to,name\\n...", "settings": {...}}` (201) |
| `GET /admin/campaigns`, `GET /admin/campaigns/NAME` | status: state, counts per outcome, attempts |
| `POST /admin/campaigns/NAME/pause` / `resume` / `cancel` | change its state |
| `GET /admin/campaigns/NAME/export` | one CSV row per number: to, attempts, outcome, last_attempt_at |
| `GET /admin/dnc`, `POST /admin/dnc` | the do-not-call list; `{"add": [...], "remove": [...]}` |

Reads follow the admin role (open on the local demo). Anything that places calls or changes who may be called
(starting, resuming a campaign; the do-not-call list) needs the admin token even on the local demo, like
`POST /admin/sip/dial`: a tunnel to a demo server must not hand the internet an autodialler.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError

from duetaspan.config.base import format_errors
from duetaspan.config.store import CampaignConfig
from duetaspan.outbound.contacts import ContactsError, contacts_from_rows, parse_contacts
from duetaspan.outbound.handle import SETTING_KEYS, CampaignExists, create_campaign
from duetaspan.outbound.scheduler import effective_settings
from duetaspan.outbound.status import campaign_status, export_csv
from duetaspan.store.db import Store

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MAX_BODY = 20 * 1024 * 1024
NEEDS_TOKEN = ("starting campaigns and changing the do-not-call list need the admin token even on a local demo "
               "server: start it with $DUETASPAN_ADMIN_TOKEN set and send Authorization: Bearer <token>")
_HEADERS = {"Cache-Control": "no-store"}


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=_HEADERS)


def _time(value: str | None, name: str) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name} {value!r}: epoch seconds or ISO 8601 (2026-03-02T09:00:00Z)") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()


class StoreRoutes:
    """The routes above, on one server's store. `wake()` tells the scheduler a campaign can go (None: this
    server runs no scheduler; another server on the same database dials)."""

    def __init__(self, store: Store, config: CampaignConfig, wake: Callable[[], None] | None = None) -> None:
        self.store, self.config, self.wake = store, config, wake

    def mount(self, app: FastAPI) -> None:
        self.app = app
        add = app.add_api_route
        add("/admin/calls", self.calls, methods=["GET"], include_in_schema=False)
        add("/admin/campaigns", self.start, methods=["POST"], include_in_schema=False)
        add("/admin/campaigns", self.list, methods=["GET"], include_in_schema=False)
        add("/admin/campaigns/{name}", self.status, methods=["GET"], include_in_schema=False)
        add("/admin/campaigns/{name}/export", self.export, methods=["GET"], include_in_schema=False)
        add("/admin/campaigns/{name}/{action}", self.act, methods=["POST"], include_in_schema=False)
        add("/admin/dnc", self.dnc_list, methods=["GET"], include_in_schema=False)
        add("/admin/dnc", self.dnc_change, methods=["POST"], include_in_schema=False)

    def _refused(self, request: Request, *, strict: bool = False) -> Response | None:
        admin = getattr(self.app.state, "admin", None)
        if admin is None:
            return _error(403, "no admin role on this server")
        refused = admin.refusal(request)
        if refused is None and strict and getattr(admin, "token", None) is None:
            refused = _error(403, NEEDS_TOKEN)
        return refused

    async def calls(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        q = request.query_params
        try:
            since, until = _time(q.get("since"), "since"), _time(q.get("until"), "until")
            limit = int(q.get("limit") or 100)
        except ValueError as exc:
            return _error(400, str(exc))
        async with self.store.transaction() as tx:
            campaign = q.get("campaign")
            if campaign:
                camp = await tx.campaign(campaign)
                campaign = camp.id if camp else campaign
            calls = await tx.calls(since=since, until=until, outcome=q.get("outcome"), number=q.get("number"),
                                   campaign=campaign, transport=q.get("transport"), limit=limit)
        return JSONResponse({"calls": [c.to_json() for c in calls]}, headers=_HEADERS)

    async def start(self, request: Request) -> Response:
        if (refused := self._refused(request, strict=True)) is not None:
            return refused
        body = await request.body()
        if len(body) > MAX_BODY:
            return _error(413, f"the body is over {MAX_BODY} bytes")
        try:
            data = json.loads(body or b"{}")
            if not isinstance(data, dict):
                raise ValueError
        except ValueError:
            return _error(400, 'the body must be a JSON object: {"name": ..., "csv": "to\\n+1555..."}')
        name = data.get("name") or time.strftime("campaign-%Y%m%d-%H%M%S", time.gmtime())
        if not isinstance(name, str) or not NAME.match(name):
            return _error(400, f"name {name!r}: letters, digits, _ . - (64 at most)")
        overrides = data.get("settings") or {}
        unknown = sorted(set(overrides) - SETTING_KEYS) if isinstance(overrides, dict) else ["(not an object)"]
        if unknown:
            return _error(400, f"settings {unknown}: only {', '.join(sorted(SETTING_KEYS))}")
        try:
            effective_settings(self.config, overrides)
            rows = data.get("contacts")
            contacts = contacts_from_rows(rows) if isinstance(rows, list) else parse_contacts(str(data.get("csv") or ""))
        except ValidationError as exc:
            return _error(400, f"settings: {format_errors(exc)}")
        except ContactsError as exc:
            return _error(400, f"contacts: {exc}")
        try:
            status = await create_campaign(self.store, self.config, name, contacts, overrides)
        except CampaignExists as exc:
            return _error(409, f"{exc} (--name)")
        if self.wake is not None:
            self.wake()
        return JSONResponse(status, status_code=201, headers=_HEADERS)

    async def list(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        async with self.store.transaction(snapshot=True) as tx:
            out = [await campaign_status(tx, c) for c in await tx.campaigns()]
        return JSONResponse({"campaigns": out}, headers=_HEADERS)

    async def status(self, request: Request, name: str) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        async with self.store.transaction(snapshot=True) as tx:
            camp = await tx.campaign(name)
            if camp is None:
                return _error(404, f"no campaign {name!r}")
            return JSONResponse(await campaign_status(tx, camp), headers=_HEADERS)

    async def export(self, request: Request, name: str) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        async with self.store.transaction(snapshot=True) as tx:
            camp = await tx.campaign(name)
            if camp is None:
                return _error(404, f"no campaign {name!r}")
            text = await export_csv(tx, camp)
        return PlainTextResponse(text, media_type="text/csv", headers=_HEADERS)

    async def act(self, request: Request, name: str, action: str) -> Response:
        states = {"pause": "paused", "resume": "running", "cancel": "cancelled"}
        if action not in states:
            return _error(404, f"no action {action!r}: pause, resume or cancel")
        if (refused := self._refused(request, strict=action == "resume")) is not None:
            return refused
        async with self.store.transaction() as tx:
            camp = await tx.campaign(name)
            if camp is None:
                return _error(404, f"no campaign {name!r}")
            if camp.state in ("cancelled", "done") and action != "cancel":
                return _error(409, f"campaign {name!r} is {camp.state}")
            if camp.state != "done":
                await tx.set_campaign_state(camp.id, states[action])
                await tx.emit(f"campaign.{states[action]}", data={"campaign_id": camp.id, "name": name})
            camp.state = states[action] if camp.state != "done" else camp.state
            status = await campaign_status(tx, camp)
        if action == "resume" and self.wake is not None:
            self.wake()
        return JSONResponse(status, headers=_HEADERS)

    async def dnc_list(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        async with self.store.transaction() as tx:
            rows = await tx.dnc_list()
        return JSONResponse({"numbers": rows}, headers=_HEADERS)

    async def dnc_change(self, request: Request) -> Response:
        if (refused := self._refused(request, strict=True)) is not None:
            return refused
        try:
            data = json.loads(await request.body() or b"{}")
            add, remove = list(data.get("add") or []), list(data.get("remove") or [])
            source = str(data.get("source") or "api")[:32]
            if not all(isinstance(n, str) and 0 < len(n) <= 256 for n in add + remove):
                raise ValueError
        except (ValueError, AttributeError, TypeError):
            return _error(400, 'the body must be {"add": ["+1555..."], "remove": [...]} (strings)')
        async with self.store.transaction() as tx:
            added = await tx.dnc_add(add, now=time.time(), source=source)
            removed = await tx.dnc_remove(remove)
            if added or removed:
                await tx.emit("dnc.changed", data={"added": added, "removed": removed, "source": source})
        return JSONResponse({"added": added, "removed": removed}, headers=_HEADERS)


__all__ = ["StoreRoutes"]
