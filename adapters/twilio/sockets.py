"""The socket side of a Twilio Media Stream: the few operations a stream needs, and Starlette's WebSocket behind them.

`StreamSocket` is what `run_stream` and `TwilioCall` talk to; `StarletteSocket` adapts an accepted
Starlette/FastAPI WebSocket (a peer gone mid-send is reported by the receive side, never raised).

Example:
    >>> # await run_stream(StarletteSocket(websocket), handler, grant=grant, limits=StreamLimits())
"""

from __future__ import annotations

from typing import Protocol


class StreamSocket(Protocol):
    """The few socket operations a stream needs (Starlette's WebSocket behind `StarletteSocket`)."""

    async def receive(self) -> str | bytes | None:
        """The next message, or None once the peer has closed."""
        ...

    async def send_text(self, text: str) -> None: ...

    async def close(self, code: int, reason: str = "") -> None: ...


class StarletteSocket:
    """`StreamSocket` over an accepted Starlette/FastAPI WebSocket."""

    def __init__(self, websocket: object) -> None:
        self._ws = websocket
        self._closed = False

    async def receive(self) -> str | bytes | None:
        if self._closed:
            return None
        message = await self._ws.receive()  # type: ignore[attr-defined]
        if message["type"] == "websocket.disconnect":
            self._closed = True
            return None
        if message.get("text") is not None:
            return message["text"]
        return message.get("bytes") or b""

    async def send_text(self, text: str) -> None:
        if self._closed:
            return
        try:
            await self._ws.send_text(text)  # type: ignore[attr-defined]
        except Exception:  # the peer went away mid-send; the receive side reports the end
            self._closed = True

    async def close(self, code: int, reason: str = "") -> None:
        if self._closed:
            return
        self._closed = True
        await self._ws.close(code=code, reason=reason)  # type: ignore[attr-defined]


__all__ = ["StarletteSocket", "StreamSocket"]
