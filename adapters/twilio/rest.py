"""Twilio's REST API for what a call's tools and the `call` command do: hang up, transfer, place a call.

Built on the twilio library's async client. `api_base_url` swaps `https://api.twilio.com` for another root
(a loopback fake Twilio in tests, a proxy in production); `http_client` replaces the whole HTTP layer. The
auth token is kept as a `SecretStr` and never appears in logs or error messages.

Example:
    >>> creds = TwilioCredentials(account_sid="AC123", auth_token="secret", api_base_url="http://127.0.0.1:9")
    >>> creds
    TwilioCredentials(account_sid='AC123', auth_token=SecretStr('**********'), api_base_url='http://127.0.0.1:9')
    >>> # async with TwilioRest(creds) as rest: await rest.hang_up("CA...")
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp
from pydantic import BaseModel, SecretStr
from twilio.base.exceptions import TwilioException, TwilioRestException
from twilio.http import AsyncHttpClient
from twilio.http.async_http_client import AsyncTwilioHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from duetaspan.adapters.twilio import twiml
from duetaspan.adapters.twilio.errors import TwilioConfigError, TwilioRestError

logger = logging.getLogger("duetaspan.twilio")

CALL_STATUS_EVENTS: tuple[str, ...] = ("initiated", "ringing", "answered", "completed")


class TwilioCredentials(BaseModel):
    """Account SID and auth token (from `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN` by default)."""

    account_sid: str
    auth_token: SecretStr
    api_base_url: str | None = None

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str] | None = None,
        *,
        account_sid_env: str = "TWILIO_ACCOUNT_SID",
        auth_token_env: str = "TWILIO_AUTH_TOKEN",
    ) -> TwilioCredentials:
        """Read the account SID and auth token (variable names from `[twilio] account_sid_env` /
        `auth_token_env`, `TWILIO_ACCOUNT_SID` / `TWILIO_AUTH_TOKEN` by default) and optional
        `TWILIO_API_BASE_URL`."""
        env = os.environ if env is None else env
        sid, token = env.get(account_sid_env, ""), env.get(auth_token_env, "")
        missing = [name for name, value in ((account_sid_env, sid), (auth_token_env, token)) if not value]
        if missing:
            raise TwilioConfigError(
                f"{' and '.join(missing)} not set: export your Twilio account SID and auth token "
                "(console.twilio.com, Account Info)"
            )
        return cls(
            account_sid=sid, auth_token=SecretStr(token), api_base_url=env.get("TWILIO_API_BASE_URL") or None
        )


# what a REST request raises when Twilio is never reached (DNS, refused connection, timeout)
UNREACHABLE = (aiohttp.ClientError, OSError, TimeoutError)


class RebasedHttpClient(AsyncTwilioHttpClient):
    """The twilio async HTTP client with every request sent to `base_url` instead of `*.twilio.com`."""

    def __init__(self, base_url: str, timeout: float | None = 10.0) -> None:
        super().__init__(timeout=timeout)
        self.base_url = base_url.rstrip("/")

    async def request(self, method: str, url: str, *args: object, **kwargs: object) -> Response:  # type: ignore[override]
        parts = urlsplit(url)
        rebased = f"{self.base_url}{parts.path}" + (f"?{parts.query}" if parts.query else "")
        return await super().request(method, rebased, *args, **kwargs)  # type: ignore[arg-type]


class TwilioRest:
    """Call control over Twilio's REST API; one per server (or per `call` command).

    Example:
        >>> async def demo(creds: TwilioCredentials) -> None:
        ...     async with TwilioRest(creds) as rest:
        ...         sid = await rest.place_call("+15551234567", "+15557654321", "https://agent.example.com/twilio/voice")
        ...         await rest.transfer(sid, "+15550001111")
    """

    def __init__(
        self,
        credentials: TwilioCredentials,
        *,
        http_client: AsyncHttpClient | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.credentials = credentials
        if http_client is None:
            http_client = (
                RebasedHttpClient(credentials.api_base_url, timeout=timeout)
                if credentials.api_base_url
                else AsyncTwilioHttpClient(timeout=timeout)
            )
        self._http = http_client
        self._client = Client(
            credentials.account_sid,
            credentials.auth_token.get_secret_value(),
            http_client=http_client,
            environment={},  # never pick up other credentials from the environment
        )

    async def __aenter__(self) -> TwilioRest:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        close = getattr(self._http, "close", None)
        if close is not None:
            await close()

    def _unreachable(self, exc: BaseException) -> str:
        where = self.credentials.api_base_url or "https://api.twilio.com"
        why = str(exc) or type(exc).__name__
        return f"Twilio's REST API at {where} cannot be reached ({why}); check the network (or TWILIO_API_BASE_URL)"

    async def hang_up(self, call_sid: str) -> bool:
        """End a live call. Returns False when Twilio says it had already ended."""
        return await self._set_status(call_sid, "completed", "hang up", "hung up")

    async def _set_status(self, call_sid: str, status: str, verb: str, done: str) -> bool:
        """`Status=<status>` on the call; False when Twilio says it is gone (404), else TwilioRestError."""
        try:
            await self._client.calls(call_sid).update_async(status=status)
        except TwilioRestException as exc:
            if exc.status == 404:
                logger.info("call %s: %s found the call already gone", call_sid, verb)
                return False
            raise _rest_error(verb, call_sid, exc) from None
        except TwilioException as exc:
            raise TwilioRestError(f"{verb} call {call_sid}: {type(exc).__name__}: {exc}") from None
        except UNREACHABLE as exc:
            raise TwilioRestError(f"{verb} call {call_sid}: {self._unreachable(exc)}") from None
        logger.info("call %s: %s through the REST API", call_sid, done)
        return True

    async def transfer(self, call_sid: str, to: str, caller_id: str | None = None) -> None:
        """Move a live call to `to` (`<Dial>`); this ends its media stream and so the agent's part."""
        try:
            await self._client.calls(call_sid).update_async(twiml=twiml.transfer(to, caller_id))
        except TwilioRestException as exc:
            raise _rest_error(f"transfer to {to}", call_sid, exc) from None
        except TwilioException as exc:
            raise TwilioRestError(f"transfer call {call_sid}: {type(exc).__name__}: {exc}") from None
        except UNREACHABLE as exc:
            raise TwilioRestError(f"transfer call {call_sid}: {self._unreachable(exc)}") from None
        logger.info("call %s: transferred to %s through the REST API", call_sid, to)

    async def apologize(self, call_sid: str, message: str = twiml.APOLOGY_MESSAGE) -> None:
        """Replace a live call's TwiML with a spoken apology and a hang-up (its media stream ends with it)."""
        try:
            await self._client.calls(call_sid).update_async(twiml=twiml.apology(message))
        except TwilioRestException as exc:
            raise _rest_error("apologize and hang up", call_sid, exc) from None
        except TwilioException as exc:
            raise TwilioRestError(f"apologize on call {call_sid}: {type(exc).__name__}: {exc}") from None
        logger.info("call %s: apology and hang-up sent through the REST API", call_sid)

    async def place_call(
        self,
        to: str,
        from_: str,
        url: str | None = None,
        *,
        twiml: str | None = None,
        status_callback: str | None = None,
        status_events: Sequence[str] = CALL_STATUS_EVENTS,
        timeout_s: int | None = None,
    ) -> str:
        """Place an outbound call whose answer fetches TwiML from `url` (our voice webhook), or runs `twiml`
        (the server's own `<Connect><Stream>`, `duetaspan.adapters.twilio.outbound`); returns its SID."""
        if (url is None) == (twiml is None):
            raise ValueError("place_call: give exactly one of url and twiml")
        kwargs: dict[str, object] = {"to": to, "from_": from_}
        kwargs |= {"url": url, "method": "POST"} if url is not None else {"twiml": twiml}
        if status_callback:
            kwargs |= {
                "status_callback": status_callback,
                "status_callback_method": "POST",
                "status_callback_event": list(status_events),
            }
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        try:
            call = await self._client.calls.create_async(**kwargs)  # type: ignore[arg-type]
        except TwilioRestException as exc:
            raise _rest_error(f"place a call to {to} from {from_}", "-", exc) from None
        except TwilioException as exc:
            raise TwilioRestError(f"place a call to {to}: {type(exc).__name__}: {exc}") from None
        except UNREACHABLE as exc:
            raise TwilioRestError(f"place a call to {to}: {self._unreachable(exc)}") from None
        logger.info("call %s: placed to %s from %s (%s)", call.sid, to, from_, f"answer URL {url}" if url else "TwiML")
        return str(call.sid)

    async def cancel(self, call_sid: str) -> bool:
        """Stop a call we placed that still rings (`Status=canceled`); False when it had ended already."""
        return await self._set_status(call_sid, "canceled", "cancel", "cancelled")


def _rest_error(action: str, call_sid: str, exc: TwilioRestException) -> TwilioRestError:
    code = f" (Twilio error {exc.code})" if exc.code else ""
    return TwilioRestError(f"{action} (call {call_sid}): HTTP {exc.status}{code}: {exc.msg}")
