"""The ingress's relay of one Twilio stream to the replica that runs its call: text messages both ways until
one side ends; the other side is closed with a matching code (a replica gone without a close frame: 1011).

Example:
    >>> # outcome = await relay(twilio_websocket, await http.ws_connect(route.relay_url))
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect

from duetaspan.adapters.twilio.errors import CLOSE_INTERNAL_ERROR, CLOSE_NORMAL

# close codes of the replica's stream passed on to Twilio as they are (normal end, protocol faults)
_RELAYED_CLOSE_CODES = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009})


async def relay(twilio: WebSocket, upstream: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """Copy text messages both ways until one side ends; the other side is closed with a matching code."""
    outcome: dict[str, Any] = {"ended_by": None, "close_code": None, "to_replica": 0, "to_twilio": 0}

    async def inbound() -> None:  # Twilio -> replica, binary frames too: the replica's protocol refuses them
        while True:
            try:
                message = await twilio.receive()
            except (WebSocketDisconnect, RuntimeError):
                message = {"type": "websocket.disconnect"}
            if message["type"] == "websocket.disconnect":
                outcome["ended_by"] = outcome["ended_by"] or "twilio"
                return
            if message.get("text") is not None:
                await upstream.send_str(message["text"])
            else:
                await upstream.send_bytes(message.get("bytes") or b"")
            outcome["to_replica"] += 1

    async def outbound() -> None:  # replica -> Twilio
        async for message in upstream:
            if message.type == aiohttp.WSMsgType.TEXT:
                await twilio.send_text(message.data)
                outcome["to_twilio"] += 1
            elif message.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSED):
                break
        outcome["ended_by"] = outcome["ended_by"] or "replica"

    tasks = [asyncio.create_task(inbound()), asyncio.create_task(outbound())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if outcome["ended_by"] == "twilio":
        with contextlib.suppress(Exception):
            await upstream.close(code=CLOSE_NORMAL)
        outcome["close_code"] = CLOSE_NORMAL
    else:
        code = upstream.close_code
        # anything else (1006: no close frame) means the replica's process or node is gone
        outcome["close_code"] = code if code in _RELAYED_CLOSE_CODES else CLOSE_INTERNAL_ERROR
        with contextlib.suppress(Exception):
            await twilio.close(
                code=outcome["close_code"], reason="call ended" if code == CLOSE_NORMAL else ""
            )
    return outcome


__all__ = ["relay"]
