"""`duetaspan webhooks list|replay` (the outbox) and `duetaspan records purge|delete` (retention and
data-subject deletes), against the store and record folder of an agent.toml (relied-on forms):

    duetaspan webhooks list --config agent.toml [--state dead] [--json]
    duetaspan webhooks replay --config agent.toml EVENT_ID... | --dead
    duetaspan records purge --config agent.toml --before 2026-01-01
    duetaspan records delete --config agent.toml CALL_ID | --number +15551234567

The store is `[store]` (`$DUETASPAN_STORE_URL` first), the record folder `[recording] dir` (`--record-dir`
overrides it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

from duetaspan.errors import ConfigError


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="agent.toml", help="the agent's config (its [store] and [recording])")
    p.add_argument("--record-dir", type=Path, help="the record folder (default: [recording] dir)")


def register(subparsers: Any) -> None:
    hooks = subparsers.add_parser("webhooks", help="list or replay the webhook events of the store's outbox")
    hsub = hooks.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = hsub.add_parser("list", help="events oldest first, with their state and last answer")
    _common(ls)
    ls.add_argument("--state", choices=("pending", "delivered", "dead"))
    ls.add_argument("--type", help="one event type (call.ended, ...)")
    ls.add_argument("--call", help="one call's events")
    ls.add_argument("--limit", type=int, default=100)
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.set_defaults(func=_list)
    rp = hsub.add_parser("replay", help="send events again (dead letters, or any by id)")
    _common(rp)
    rp.add_argument("ids", nargs="*", metavar="EVENT_ID")
    rp.add_argument("--dead", action="store_true", help="every dead letter")
    rp.set_defaults(func=_replay)

    records = subparsers.add_parser("records", help="purge old call data or delete one call's or person's")
    rsub = records.add_subparsers(dest="action", metavar="ACTION", required=True)
    pg = rsub.add_parser("purge", help="delete records, audio and index rows of calls before a date")
    _common(pg)
    pg.add_argument("--before", required=True, metavar="DATE", help="YYYY-MM-DD (UTC) or an ISO time")
    pg.add_argument("--audio-only", action="store_true", help="delete only the wav files")
    pg.set_defaults(func=_purge)
    rm = rsub.add_parser("delete", help="delete one call, or every call of a number (data-subject request)")
    _common(rm)
    rm.add_argument("call_id", nargs="?", metavar="CALL_ID")
    rm.add_argument("--number", metavar="+E164", help="every call from or to this number (DNC entries stay)")
    rm.set_defaults(func=_delete)


def _config(args: argparse.Namespace) -> Any:
    from duetaspan.config import AgentConfig

    return AgentConfig.load(args.config) if args.config else AgentConfig()


async def _store(config: Any) -> Any:
    from duetaspan.store import open_store, store_target

    return await open_store(store_target(config.store.url, config.store.path, config.server.data_dir))


def _record_dir(args: argparse.Namespace, config: Any) -> Path:
    return Path(args.record_dir) if args.record_dir else Path(config.recording.dir)


async def _list(args: argparse.Namespace) -> int:
    store = await _store(_config(args))
    try:
        async with store.transaction() as tx:
            events = await tx.events(state=args.state, type=args.type, call_id=args.call, limit=args.limit)
    finally:
        await store.close()
    for e in events:
        row = {"id": e.id, "type": e.type, "created": e.created, "call_id": e.call_id, "state": e.state,
               "attempts": e.attempts, "next_attempt_at": e.next_attempt_at, "last_answer": e.last_answer}  # fmt: skip
        if args.json:
            print(json.dumps(row, ensure_ascii=False))
        else:
            when = dt.datetime.fromtimestamp(e.created, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
            print(f"{e.id}  {e.type:16s} {e.call_id or '-':24s} {when}  {e.state:9s} tries {e.attempts}")
    if not args.json:
        print(f"{len(events)} events")
    return 0


async def _replay(args: argparse.Namespace) -> int:
    from duetaspan.webhooks.delivery import replay

    if not args.ids and not args.dead:
        raise ConfigError("webhooks replay: name EVENT_IDs or pass --dead")
    store = await _store(_config(args))
    try:
        n = await replay(store, args.ids, dead=args.dead)
    finally:
        await store.close()
    print(f"{n} events queued for delivery (a running server sends them)")
    return 0


def _date(text: str) -> float:
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--before {text!r}: expected YYYY-MM-DD or an ISO time") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


async def _purge(args: argparse.Namespace) -> int:
    from duetaspan.webhooks.retention import purge

    config = _config(args)
    before = _date(args.before)
    store = await _store(config)
    try:
        if args.audio_only:
            out = await purge(store, _record_dir(args, config), audio_before=before)
        else:
            # undelivered events too; with URLs set, only those past their retry window (never one still sent)
            retry_from = time.time() - config.webhooks.retry_for_s
            undelivered = min(before, retry_from) if config.webhooks.urls else before
            out = await purge(store, _record_dir(args, config), audio_before=before, records_before=before,
                              undelivered_before=undelivered)  # fmt: skip
    finally:
        await store.close()
    print(f"purged before {args.before}: {out}")
    return 0


async def _delete(args: argparse.Namespace) -> int:
    from duetaspan.webhooks.retention import delete_call, delete_number

    if bool(args.call_id) == bool(args.number):
        raise ConfigError("records delete: give a CALL_ID or --number +E164 (one of them)")
    config = _config(args)
    store = await _store(config)
    try:
        if args.number:
            out = await delete_number(store, _record_dir(args, config), args.number)
        else:
            out = await delete_call(store, _record_dir(args, config), args.call_id)
    finally:
        await store.close()
    print(f"deleted {len(out.calls)} calls: {out}")
    return 0


__all__ = ["register"]
