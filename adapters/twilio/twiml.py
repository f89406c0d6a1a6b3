"""The TwiML the voice webhook answers (connect the call to our stream socket, or refuse it when busy or
draining, `drain_refusal`) and what a live call is redirected to (a transfer, an apology when the engine went
down).

Example:
    >>> print(connect_stream("wss://agent.example.com/twilio/stream/tok", {"from_number": "+15550001"}))
    <?xml version="1.0" encoding="UTF-8"?><Response><Connect><Stream url="wss://agent.example.com/twilio/stream/tok"><Parameter name="from_number" value="+15550001" /></Stream></Connect></Response>
"""

from __future__ import annotations

from collections.abc import Mapping

from twilio.twiml.voice_response import Connect, VoiceResponse

BUSY_MESSAGE = "All our agents are busy right now. Please call again in a few minutes. Goodbye."
APOLOGY_MESSAGE = (
    "We are sorry, we are having technical trouble and have to end this call. "
    "Please call again in a few minutes. Goodbye."
)


def connect_stream(stream_url: str, parameters: Mapping[str, str], status_callback: str | None = None) -> str:
    """`<Connect><Stream url=...>` with one `<Parameter>` per item (Twilio echoes them in `start`)."""
    response = VoiceResponse()
    connect = Connect()
    kwargs = {"status_callback": status_callback, "status_callback_method": "POST"} if status_callback else {}
    stream = connect.stream(url=stream_url, **kwargs)
    for name, value in parameters.items():
        stream.parameter(name=name, value=value)
    response.append(connect)
    return str(response)


def busy(message: str = BUSY_MESSAGE) -> str:
    """A spoken refusal then hang-up, for when every call slot is taken."""
    response = VoiceResponse()
    response.say(message)
    response.hangup()
    return str(response)


def apology(message: str = APOLOGY_MESSAGE) -> str:
    """A spoken apology then hang-up, for a live call whose engine went down (sent as the call's new TwiML)."""
    response = VoiceResponse()
    response.say(message)
    response.hangup()
    return str(response)


def drain_refusal(redirect_url: str | None = None) -> str:
    """What a caller ringing while the server drains gets: `<Redirect>` to `redirect_url` (another server,
    which Twilio asks for TwiML with the same call), else `<Reject reason="busy"/>` (the caller hears busy)."""
    response = VoiceResponse()
    if redirect_url:
        response.redirect(redirect_url, method="POST")
    else:
        response.reject(reason="busy")
    return str(response)


def transfer(to: str, caller_id: str | None = None) -> str:
    """`<Dial>` the call on to `to` (what `transfer_call` redirects a live call to)."""
    response = VoiceResponse()
    response.dial(to, caller_id=caller_id) if caller_id else response.dial(to)
    return str(response)
