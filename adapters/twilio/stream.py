"""The protocol loop of one Twilio Media Stream socket: `run_stream` and its state machine.

`run_stream` reads Twilio's messages, validates them (order, sizes, sequence numbers, the call the token was
minted for), decodes inbound mu-law to 24 kHz float32 PCM, and runs the call handler beside it with a
`TwilioCall` (`duetaspan.adapters.twilio.call`: the agent's side and outbound pacing) over a `StreamSocket`
(`duetaspan.adapters.twilio.sockets`). A protocol violation closes this socket only, with the close code of
its `StreamProtocolError`; other calls are untouched. The call's names are re-exported here.

Example:
    >>> async def echo(call: TwilioCall) -> None:    # a call handler: repeat what the caller says
    ...     async for pcm in call.audio():
    ...         call.send_audio(pcm)
    >>> # await run_stream(StarletteSocket(websocket), echo, grant=grant, limits=StreamLimits())
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from duetaspan.adapters.twilio.audio import TWILIO_RATE, MulawDecoder
from duetaspan.adapters.twilio.call import CallControl, CallInfo, StreamLimits, StreamStats, TwilioCall
from duetaspan.adapters.twilio.errors import (
    CLOSE_INTERNAL_ERROR,
    CLOSE_NORMAL,
    MalformedMessage,
    OutOfOrder,
    PolicyViolation,
    StreamProtocolError,
)
from duetaspan.adapters.twilio.messages import (
    DTMF_DIGITS,
    ConnectedEvent,
    DtmfEvent,
    MarkEvent,
    MediaEvent,
    StartEvent,
    StopEvent,
    UnknownEvent,
    parse_message,
)
from duetaspan.adapters.twilio.security import StreamGrant
from duetaspan.adapters.twilio.sockets import StarletteSocket, StreamSocket
from duetaspan.model.convention import SAMPLE_RATE

logger = logging.getLogger("duetaspan.twilio")

CallHandler = Callable[[TwilioCall], Awaitable[None]]


async def run_stream(
    socket: StreamSocket,
    handler: CallHandler,
    *,
    grant: StreamGrant,
    limits: StreamLimits,
    control: CallControl | None = None,
    in_rate: int = SAMPLE_RATE,
    on_start: Callable[[TwilioCall], object] | None = None,
) -> TwilioCall | None:
    """Serve one accepted stream socket until `stop`, a close, a violation or the handler's end.

    Returns the call (None when the stream never started properly). Never raises for the peer's faults:
    they are logged with the call and closed with the matching code.
    """
    call: TwilioCall | None = None
    handler_task: asyncio.Task[None] | None = None
    pacer_task: asyncio.Task[None] | None = None
    close_code, close_reason = CLOSE_NORMAL, "call ended"
    label = f"call {grant.call_sid}"
    try:
        call, first_seq = await asyncio.wait_for(_await_start(socket, grant, limits), limits.start_timeout_s)
        call.control, call.in_rate = control, in_rate
        if on_start is not None:
            on_start(call)
        label = f"call {call.info.call_sid} stream {call.info.stream_sid}"
        logger.info("%s: stream started (from %s to %s)", label, call.info.from_number, call.info.to_number)
        handler_task = asyncio.create_task(handler(call), name=f"twilio-handler-{call.info.call_sid}")
        pacer_task = asyncio.create_task(call._pace(), name=f"twilio-pacer-{call.info.call_sid}")
        handler_task.add_done_callback(lambda _: _agent_ended(socket, call, label))
        close_code, close_reason = await _receive_loop(socket, call, limits, first_seq, label)
    except TimeoutError:
        close_code, close_reason = PolicyViolation.close_code, "no start message"
        logger.warning(
            "%s: no valid `start` within %.1f s; closing (%d)", label, limits.start_timeout_s, close_code
        )
    except StreamProtocolError as exc:
        close_code, close_reason = exc.close_code, type(exc).__name__
        logger.warning("%s: %s; closing (%d)", label, exc, close_code)
    except _PeerClosed:
        close_code, close_reason = 0, ""
        logger.info("%s: socket closed before the stream started", label)
    finally:
        if call is not None:
            call._end(call.end_reason or close_reason or "closed")
        if pacer_task is not None:
            pacer_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pacer_task
        if handler_task is not None:
            await _finish_handler(handler_task, limits.handler_grace_s, label)
        if close_code:
            with contextlib.suppress(Exception):
                await socket.close(close_code, close_reason)
    if call is not None:
        logger.info(
            "%s: ended (%s): %d media in, %d out, %d marks played, %d clears, %d DTMF",
            label,
            call.end_reason,
            call.stats.media_in,
            call.stats.media_out,
            call.stats.marks_played,
            call.stats.clears,
            call.stats.dtmf,
        )
    return call


class _PeerClosed(Exception):
    pass


async def _await_start(
    socket: StreamSocket, grant: StreamGrant, limits: StreamLimits
) -> tuple[TwilioCall, int]:
    last_seq = 0
    while True:
        text = await socket.receive()
        if text is None:
            raise _PeerClosed
        message = parse_message(text, limits.max_message_bytes)
        if isinstance(message, ConnectedEvent | UnknownEvent):
            _ignore(message, grant.call_sid)
            continue
        if not isinstance(message, StartEvent):
            raise OutOfOrder(f"`{message.event}` before `start`")
        if message.sequence_number <= last_seq:
            raise OutOfOrder(f"start sequence number {message.sequence_number}")
        start = message.start
        if start.call_sid != grant.call_sid or start.account_sid != grant.account_sid:
            raise PolicyViolation(
                f"start is for call {start.call_sid[:40]} / account {start.account_sid[:40]}, "
                f"but the token was minted for call {grant.call_sid} / account {grant.account_sid}"
            )
        fmt = start.media_format
        if fmt.encoding != "audio/x-mulaw" or fmt.sample_rate != TWILIO_RATE or fmt.channels != 1:
            raise MalformedMessage(
                f"media format {fmt.encoding[:40]} {fmt.sample_rate} Hz x{fmt.channels} "
                f"(expected audio/x-mulaw 8000 Hz mono)"
            )
        info = CallInfo(
            call_sid=start.call_sid,
            stream_sid=start.stream_sid,
            account_sid=start.account_sid,
            from_number=grant.from_number or start.custom_parameters.get("from_number", ""),
            to_number=grant.to_number or start.custom_parameters.get("to_number", ""),
            custom_parameters=dict(start.custom_parameters),
        )
        return TwilioCall(info=info, limits=limits, socket=socket), message.sequence_number


def _ignore(message: ConnectedEvent | UnknownEvent, call_sid: str) -> None:
    if isinstance(message, UnknownEvent):  # Twilio adds message types over time: not a violation
        logger.debug("call %s: unknown event %r ignored", call_sid, message.event)


def _agent_ended(socket: StreamSocket, call: TwilioCall, label: str) -> None:
    """The handler returned first: end the call and close the socket, which ends the receive loop."""
    if call.ended.is_set():
        return
    call._end("agent ended the call")
    logger.info("%s: the agent ended the call; closing the stream", label)
    task = asyncio.ensure_future(socket.close(CLOSE_NORMAL, "agent ended the call"))
    task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieve, never raise


async def _receive_loop(
    socket: StreamSocket, call: TwilioCall, limits: StreamLimits, last_seq: int, label: str
) -> tuple[int, str]:
    decoder = MulawDecoder(call.in_rate)
    stream_sid = call.info.stream_sid
    while True:
        text = await socket.receive()
        if text is None:
            call._end(call.end_reason or "socket closed")
            return 0, ""
        message = parse_message(text, limits.max_message_bytes)
        if isinstance(message, UnknownEvent):
            _ignore(message, call.info.call_sid)
            continue
        if isinstance(message, ConnectedEvent | StartEvent):
            raise OutOfOrder(f"second `{message.event}` on a started stream")
        if message.stream_sid != stream_sid:
            raise PolicyViolation(f"message for stream {message.stream_sid[:40]} on stream {stream_sid}")
        if message.sequence_number <= last_seq:
            raise OutOfOrder(f"sequence number {message.sequence_number} after {last_seq}")
        last_seq = message.sequence_number
        if isinstance(message, MediaEvent):
            if message.media.track not in ("inbound", "inbound_track"):
                raise MalformedMessage(f"media on track {message.media.track[:20]!r} (expected inbound)")
            call.stats.media_in += 1
            call._push_inbound(decoder.decode(message.audio(limits.max_media_bytes)))
        elif isinstance(message, DtmfEvent):
            digit = message.dtmf.digit
            if len(digit) != 1 or digit not in DTMF_DIGITS:
                raise MalformedMessage(f"dtmf digit {digit[:8]!r}")
            logger.info("%s: DTMF %s", label, digit)
            call._dtmf(digit)
        elif isinstance(message, MarkEvent):
            call._mark_played(message.mark.name)
        elif isinstance(message, StopEvent):
            call._end("stop")
            logger.info("%s: stop received", label)
            return CLOSE_NORMAL, "stream stopped"


async def _finish_handler(task: asyncio.Task[None], grace_s: float, label: str) -> None:
    """Give the handler time to write its artifacts, then cancel it; its errors are logged, not raised."""
    done, _ = await asyncio.wait({task}, timeout=grace_s)
    if not done:
        logger.warning("%s: handler still running %.1f s after the end; cancelling", label, grace_s)
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception:
        logger.exception("%s: call handler failed", label)


__all__ = [
    "CLOSE_INTERNAL_ERROR",
    "CallControl",
    "CallHandler",
    "CallInfo",
    "StarletteSocket",
    "StreamLimits",
    "StreamSocket",
    "StreamStats",
    "TwilioCall",
    "run_stream",
]
