"""Recent calls on the server, behind the admin role (never the page token): a list of the record dir's calls and each call's viewer
page (`duetaspan.view`), rendered on request (off the event loop) with its audio embedded.

The list reads the server's call index (`duetaspan.store`, `agent.store`) when it has one, else the folder.

Routes:
    GET /webrtc/calls              an HTML list of the most recent calls (newest first), `?format=json` for JSON
    GET /webrtc/calls/{call_id}    that call's viewer page (404 for an unknown id or one that is not a file name)

Example:
    >>> RecentCalls(service).mount(app)   # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import html
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse

from duetaspan.adapters.webrtc.host import PageHost
from duetaspan.pipeline.artifacts import record_json_path
from duetaspan.view.page import call_page

CALLS_PATH = "/webrtc/calls"
MAX_LISTED = 100
_CALL_ID = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")
_HEADERS = {"Cache-Control": "no-store", "Referrer-Policy": "no-referrer"}


class RecentCalls:
    """The recent-calls routes of one `WebRTCService` (its token, its agent's record dir)."""

    def __init__(self, service: PageHost) -> None:
        self.service = service

    def mount(self, app: FastAPI) -> None:
        app.add_api_route(CALLS_PATH, self.list_calls, methods=["GET"], include_in_schema=False)
        app.add_api_route(CALLS_PATH + "/{call_id}", self.show_call, methods=["GET"], include_in_schema=False)

    def _record_dir(self) -> Path | None:
        record_dir = getattr(self.service.agent, "record_dir", None)
        return Path(record_dir) if record_dir is not None else None

    async def list_calls(self, request: Request) -> Response:
        refused = self.service.admin_refusal(request)
        if refused is not None:
            return refused
        folder = self._record_dir()
        store = getattr(self.service.agent, "store", None)
        if store is not None:  # the server's call index (duetaspan.store): no folder scan
            calls = await _indexed(store)
        else:
            calls = await asyncio.to_thread(_recent, folder) if folder is not None else []
        if request.query_params.get("format") == "json":
            return JSONResponse(
                {"record_dir": str(folder) if folder else None, "calls": calls}, headers=_HEADERS
            )
        rows = "".join(
            f"<tr><td><a href='{CALLS_PATH}/{quote(c['call_id'])}'>{html.escape(c['call_id'])}</a>"
            f"</td><td>{html.escape(str(c['transport'] or ''))}</td><td>{c['duration_s']:.1f} s</td>"
            f"<td>{c['spans']}</td><td>{'' if c['complete'] else 'incomplete'}</td></tr>"
            for c in calls
        )
        where = html.escape(str(folder)) if folder else "no record dir (start the server with --record-dir)"
        page = (
            "<!doctype html><meta charset=utf-8><title>duetaspan · recent calls</title>"
            "<body style='font:15px system-ui;margin:2em;color:#1d2330'><h1>Recent calls</h1>"
            f"<p>{where}</p><table cellpadding=6><tr><th>call</th><th>transport</th><th>length</th>"
            f"<th>spans</th><th></th></tr>{rows}</table>"
        )
        return HTMLResponse(page, headers=_HEADERS)

    async def show_call(self, request: Request, call_id: str) -> Response:
        refused = self.service.admin_refusal(request)
        if refused is not None:
            return refused
        folder = self._record_dir()
        record = _record_path(folder, call_id) if folder is not None else None
        if record is None:
            return JSONResponse({"error": f"no recorded call {call_id!r}"}, status_code=404)
        page = await asyncio.to_thread(call_page, record)
        return HTMLResponse(page, headers=_HEADERS)


def _record_path(folder: Path, call_id: str) -> Path | None:
    """The record of `call_id` in `folder` (its `.json`, else its `.jsonl`), never a path outside it. The file
    is named as the recorder names it: a SIP Call-ID's `1-2345@10.0.0.1` (the index's id, which the list
    links to) lies in `1-2345_10.0.0.1.json`."""
    stem = record_json_path(folder, call_id).stem
    if not _CALL_ID.match(stem):
        return None
    for suffix in (".json", ".jsonl"):
        path = folder / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


async def _indexed(store: Any) -> list[dict[str, Any]]:
    """The newest `MAX_LISTED` calls of the store's call index that have a record file, as `_recent` lists them."""
    async with store.transaction() as tx:
        entries = await tx.calls(limit=MAX_LISTED)
    return [{"call_id": e.id, "transport": e.transport, "started_at": e.started_at,
             "duration_s": round(e.duration_s or 0.0, 2), "spans": e.spans, "complete": e.complete}
            for e in entries if e.record_path or e.jsonl_path]


def _recent(folder: Path) -> list[dict[str, Any]]:
    """The newest `MAX_LISTED` finished calls in `folder` (their `.json`), with a few figures each."""
    paths = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)[:MAX_LISTED]
    calls = []
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(record, dict) or "frames" not in record:
            continue
        summary = record.get("summary") or {}
        frames = int(summary.get("frames") or len(record.get("frames") or []))
        calls.append(
            {
                "call_id": path.stem,
                "transport": (record.get("meta") or {}).get("transport"),
                "started_at": record.get("started_at"),
                "duration_s": round(frames * float(record.get("frame_ms") or 80.0) / 1000.0, 2),
                "spans": len(record.get("spans") or []),
                "complete": bool(record.get("complete")),
            }
        )
    return calls
