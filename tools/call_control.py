"""`end_call`, `transfer_call` and `send_dtmf`: side-effect tools that ask the telephony adapter to act.

They do not touch the phone line themselves: each records a `CallAction` on the `CallContext`
(`ctx.actions`, and `ctx.on_action(action)` at once). The Twilio adapter carries it out — for "end_call"
it hangs up after the agent's goodbye, for "transfer_call" it redirects the call to `action.target`
(a phone number or SIP URI); for "send_dtmf" the SIP adapter sends the digits as RFC 4733 events (IVR navigation,
extension dialling). Over MCP (`serve-mcp`) the action is returned in the structured content.

Example:
    >>> from duetaspan.registry import CallContext, ToolRegistry
    >>> import asyncio
    >>> ctx = CallContext(on_action=lambda a: print("adapter:", a.kind, a.target))
    >>> reg = ToolRegistry([make_transfer_call({"sales": "+15550001111"})])
    >>> asyncio.run(reg.call("transfer_call", {"destination": "sales"}, ctx)).reference
    adapter: transfer_call +15550001111
    '(tool result) Transferring the call to sales now.'
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from duetaspan.registry import CallContext, FunctionTool, ToolFailed, tool

_PHONE = re.compile(r"^\+?[0-9][0-9 ()./-]{2,}$")
_DIGITS = re.compile(r"^[0-9A-Da-d*#]{1,32}$")


@tool(side_effect=True, render=lambda r: r["sentence"])
async def end_call(ctx: CallContext, reason: str | None = None) -> dict:
    """Hang up: end the phone call after saying goodbye. Only when the caller asks to end the call.

    Args:
        reason: why the call ends, for the call log
    """
    action = ctx.request_action("end_call", reason=reason)
    return {"action": action.kind, "reason": reason, "sentence": "The call will end after the goodbye."}


@tool(side_effect=True, render=lambda r: r["sentence"])
async def send_dtmf(digits: str, ctx: CallContext) -> dict:
    """Press keys on the phone line (DTMF tones), e.g. to navigate a phone menu or dial an extension.

    Args:
        digits: the keys to press, in order: 0-9, *, # (at most 32)
    """
    keys = re.sub(r"[\s,-]", "", digits)
    if not _DIGITS.match(keys):
        raise ToolFailed(f"cannot press {digits[:40]!r}: only 0-9, *, # and A-D, at most 32 keys")
    action = ctx.request_action("send_dtmf", target=keys.upper())
    return {"action": action.kind, "digits": keys.upper(), "sentence": f"Pressed {keys.upper()}."}


def transfer_target(destination: str, targets: Mapping[str, str] | None = None) -> str | None:
    """Where `transfer_call` sends a call asked for `destination`: the number of a named target (names match
    case-insensitively), or, when no targets are named, the phone number itself (digits and `+`); None when the
    tool refuses it."""
    named = {k.lower(): v for k, v in (targets or {}).items()}
    key = destination.strip().lower()
    if key in named:
        return named[key]
    if _PHONE.match(destination.strip()) and not named:
        return re.sub(r"[^0-9+]", "", destination)
    return None


def make_transfer_call(targets: Mapping[str, str] | None = None) -> FunctionTool:
    """`transfer_call` limited to named `targets` (name -> number); any number is allowed when empty."""
    named = {k.lower(): v for k, v in (targets or {}).items()}
    known = ", ".join(sorted(named)) if named else ""

    @tool(
        name="transfer_call",
        side_effect=True,
        render=lambda r: r["sentence"],
        description=(
            "Transfer the phone call to a person or department. Only when the caller asks to be transferred."
            + (f" Destinations: {known}." if known else "")
        ),
    )
    async def transfer_call(destination: str, ctx: CallContext, reason: str | None = None) -> dict:
        """Transfer the call.

        Args:
            destination: the department or person to transfer to (or a phone number)
            reason: why, for the call log and the person taking the call
        """
        target = transfer_target(destination, named)
        if target is None:
            raise ToolFailed(
                f"cannot transfer to {destination!r}" + (f"; known destinations: {known}" if known else "")
            )
        action = ctx.request_action("transfer_call", target=target, reason=reason, destination=destination)
        return {
            "action": action.kind,
            "destination": destination,
            "target": target,
            "sentence": f"Transferring the call to {destination} now.",
        }

    return transfer_call


transfer_call = make_transfer_call()
