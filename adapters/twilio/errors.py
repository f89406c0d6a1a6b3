"""Errors of the Twilio adapter, each carrying the WebSocket close code or HTTP status it maps to.

Example:
    >>> from duetaspan.adapters.twilio.errors import MalformedMessage
    >>> err = MalformedMessage("media: payload is not valid base64")
    >>> (err.close_code, str(err))
    (1007, 'media: payload is not valid base64')
"""

from __future__ import annotations

from duetaspan.errors import ConfigError, DuetaspanError

# RFC 6455 close codes used on the stream socket
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_INVALID_PAYLOAD = 1007
CLOSE_POLICY_VIOLATION = 1008
CLOSE_MESSAGE_TOO_BIG = 1009
CLOSE_INTERNAL_ERROR = 1011


class TwilioError(DuetaspanError):
    """Base class of the Twilio adapter's errors."""


class TwilioConfigError(TwilioError, ConfigError):
    """Missing or invalid Twilio settings (credentials, public URL)."""


class StreamProtocolError(TwilioError):
    """The Media Stream broke the protocol; the socket is closed with `close_code`."""

    close_code: int = CLOSE_PROTOCOL_ERROR


class MalformedMessage(StreamProtocolError):
    """Not JSON, a field of the wrong type, invalid base64 or a payload of the wrong size."""

    close_code = CLOSE_INVALID_PAYLOAD


class UnsupportedMessage(StreamProtocolError):
    """A binary frame (Twilio sends text only). Unknown event names are ignored, not refused."""

    close_code = CLOSE_UNSUPPORTED_DATA


class OutOfOrder(StreamProtocolError):
    """Media before `start`, a second `start`, or a sequence number that did not increase."""

    close_code = CLOSE_PROTOCOL_ERROR


class MessageTooLarge(StreamProtocolError):
    """A message over the configured size limit."""

    close_code = CLOSE_MESSAGE_TOO_BIG


class PolicyViolation(StreamProtocolError):
    """No `start` in time, or a `start` for another call or account than the webhook minted the token for."""

    close_code = CLOSE_POLICY_VIOLATION


class StreamRefused(TwilioError):
    """The stream upgrade is refused before it is accepted; answered with HTTP `status`."""

    status: int = 403
    call_sid: str | None = None  # the call whose token it was, where known


class SignatureInvalid(StreamRefused):
    """`X-Twilio-Signature` is missing or does not match the public URL and parameters."""

    status = 403


class TokenUnknown(StreamRefused):
    """The stream token was never issued by this server (or was issued before a restart)."""

    status = 404


class TokenExpired(StreamRefused):
    """The stream token was issued but not used within its time to live."""

    status = 410


class TokenReused(StreamRefused):
    """The stream token was already used: a replayed upgrade."""

    status = 410


class CallAlreadyAnswered(StreamRefused):
    """A signed voice webhook for a call whose stream token was already used or expired: a replay."""

    status = 409


class TooManyPending(StreamRefused):
    """Every pending-token place is taken (calls on their way to the stream socket); answered busy."""

    status = 503


class TwilioRestError(TwilioError):
    """A Twilio REST request (hang up, transfer, place a call) failed; the message says which and why."""
