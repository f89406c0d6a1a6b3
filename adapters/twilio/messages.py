"""Twilio Media Streams wire messages: validation of what Twilio sends, builders for what we send back.

Inbound messages are parsed into pydantic models (unknown fields are ignored so Twilio can add some; a
missing or mistyped required field is an error). A JSON object whose `event` is a name this module does not
know parses to `UnknownEvent`, which the stream ignores: Twilio adds message types over time. `sequenceNumber`, `chunk` and `timestamp` arrive as strings
and are parsed to ints. Outbound messages are built as plain JSON strings: they are sent 50 times a second
per call and need no validation.

Example:
    >>> msg = parse_message('{"event":"dtmf","sequenceNumber":"5","streamSid":"MZ1",'
    ...                     '"dtmf":{"track":"inbound_track","digit":"7"}}', max_bytes=65536)
    >>> (type(msg).__name__, msg.sequence_number, msg.dtmf.digit)
    ('DtmfEvent', 5, '7')
    >>> media_message("MZ1", b"\\xff\\xff")
    '{"event":"media","streamSid":"MZ1","media":{"payload":"//8="}}'
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from duetaspan.adapters.twilio.errors import MalformedMessage, MessageTooLarge, UnsupportedMessage

DTMF_DIGITS = frozenset("0123456789*#ABCD")


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class MediaFormat(_Message):
    encoding: str
    sample_rate: int = Field(alias="sampleRate")
    channels: int = 1


class StartInfo(_Message):
    account_sid: str = Field(alias="accountSid")
    stream_sid: str = Field(alias="streamSid")
    call_sid: str = Field(alias="callSid")
    tracks: list[str] = Field(default_factory=list)
    custom_parameters: dict[str, str] = Field(default_factory=dict, alias="customParameters")
    media_format: MediaFormat = Field(alias="mediaFormat")


class ConnectedEvent(_Message):
    event: Literal["connected"]
    protocol: str = ""
    version: str = ""


class StartEvent(_Message):
    event: Literal["start"]
    sequence_number: int = Field(alias="sequenceNumber")
    stream_sid: str = Field(alias="streamSid")
    start: StartInfo


class MediaInfo(_Message):
    track: str = "inbound"
    chunk: int
    timestamp: int
    payload: str


class MediaEvent(_Message):
    event: Literal["media"]
    sequence_number: int = Field(alias="sequenceNumber")
    stream_sid: str = Field(alias="streamSid")
    media: MediaInfo

    def audio(self, max_bytes: int) -> bytes:
        """The decoded mu-law payload; raises `MalformedMessage` for bad base64 or a wrong size."""
        try:
            data = base64.b64decode(self.media.payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise MalformedMessage(f"media #{self.sequence_number}: payload is not valid base64") from exc
        if not 0 < len(data) <= max_bytes:
            raise MalformedMessage(
                f"media #{self.sequence_number}: payload of {len(data)} bytes (expected 1..{max_bytes})"
            )
        return data


class DtmfInfo(_Message):
    track: str = "inbound_track"
    digit: str


class DtmfEvent(_Message):
    event: Literal["dtmf"]
    sequence_number: int = Field(alias="sequenceNumber")
    stream_sid: str = Field(alias="streamSid")
    dtmf: DtmfInfo


class MarkInfo(_Message):
    name: str


class MarkEvent(_Message):
    event: Literal["mark"]
    sequence_number: int = Field(alias="sequenceNumber")
    stream_sid: str = Field(alias="streamSid")
    mark: MarkInfo


class StopInfo(_Message):
    account_sid: str = Field(default="", alias="accountSid")
    call_sid: str = Field(default="", alias="callSid")


class StopEvent(_Message):
    event: Literal["stop"]
    sequence_number: int = Field(alias="sequenceNumber")
    stream_sid: str = Field(alias="streamSid")
    stop: StopInfo = Field(default_factory=StopInfo)


class UnknownEvent(_Message):
    """A well-formed message with an `event` this server does not know (ignored, never validated further)."""

    event: str


InboundMessage = Annotated[
    ConnectedEvent | StartEvent | MediaEvent | DtmfEvent | MarkEvent | StopEvent, Field(discriminator="event")
]
_INBOUND: TypeAdapter[InboundMessage] = TypeAdapter(InboundMessage)


def parse_message(text: str | bytes, max_bytes: int) -> InboundMessage | UnknownEvent:
    """Validate one WebSocket message from Twilio; raises a `StreamProtocolError` subclass saying why not."""
    if isinstance(text, bytes):
        raise UnsupportedMessage(f"binary frame of {len(text)} bytes (Twilio sends JSON text frames)")
    if len(text) > max_bytes:
        raise MessageTooLarge(f"message of {len(text)} characters (limit {max_bytes})")
    try:
        return _INBOUND.validate_json(text)
    except ValidationError as exc:
        if exc.errors(include_url=False, include_input=False)[0]["type"] == "union_tag_invalid":
            event = _event_name(text)
            if event is not None:
                return UnknownEvent(event=event)
        raise _describe(exc) from None


def _describe(exc: ValidationError) -> MalformedMessage:
    first = exc.errors(include_url=False, include_input=False)[0]
    kind = first["type"]
    if kind == "json_invalid":
        return MalformedMessage(f"not valid JSON ({first['msg']})")
    if kind in ("union_tag_invalid", "union_tag_not_found", "model_attributes_type"):
        return MalformedMessage("a JSON object with an `event` string was expected")
    where = ".".join(str(p) for p in first["loc"]) or "message"
    return MalformedMessage(f"invalid field {where}: {first['msg']}")


def _event_name(text: str) -> str | None:
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    event = obj.get("event") if isinstance(obj, dict) else None
    return event[:40] if isinstance(event, str) else None


def media_message(stream_sid: str, ulaw: bytes) -> str:
    """An outbound `media` message carrying raw mu-law 8 kHz bytes."""
    payload = base64.b64encode(ulaw).decode("ascii")
    return f'{{"event":"media","streamSid":{json.dumps(stream_sid)},"media":{{"payload":"{payload}"}}}}'


def mark_message(stream_sid: str, name: str) -> str:
    """An outbound `mark`: Twilio echoes it back once the audio sent before it has played."""
    return json.dumps(
        {"event": "mark", "streamSid": stream_sid, "mark": {"name": name}}, separators=(",", ":")
    )


def clear_message(stream_sid: str) -> str:
    """An outbound `clear`: Twilio drops the audio it has buffered but not yet played (barge-in)."""
    return json.dumps({"event": "clear", "streamSid": stream_sid}, separators=(",", ":"))
