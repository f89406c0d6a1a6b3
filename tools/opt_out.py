"""`opt_out`: the callee asked never to be called again. The number goes on the server's do-not-call list
(`duetaspan.store`, checked by every campaign at dial time) and the call ends politely after the goodbye.

The number is the campaign row's (`campaign_to`), else the other party's: the called number on a call we
placed, the caller's on one we took. The list comes with the call (`CallContext.metadata["do_not_call"]`, set
by a server with a store); without one the tool fails, saying so, and nothing is promised to the caller.

Example:
    >>> import asyncio
    >>> from duetaspan.registry import CallContext, ToolRegistry
    >>> added = []
    >>> async def dnc(number, source="opt_out"):
    ...     added.append(number)
    ...     return True
    >>> ctx = CallContext(caller="+15550001111", metadata={"do_not_call": dnc})
    >>> print(asyncio.run(ToolRegistry([opt_out]).call("opt_out", {}, ctx)).reference)
    (tool result) Done: this number will not be called again. Apologise for the trouble and say goodbye.
    >>> added, [a.kind for a in ctx.actions]
    (['+15550001111'], ['end_call'])
"""

from __future__ import annotations

from duetaspan.registry import CallContext, ToolFailed, tool

DNC_KEY = "do_not_call"


@tool(side_effect=True, render=lambda r: r["sentence"])
async def opt_out(ctx: CallContext, reason: str | None = None) -> dict:
    """Stop calling this person: add their number to the do-not-call list and end the call politely. Only
    when the person asks not to be called again (remove me from your list, stop calling me).

    Args:
        reason: the person's words, for the call log
    """
    add = ctx.metadata.get(DNC_KEY)
    meta = ctx.metadata
    outbound = bool(meta.get("campaign_to")) or meta.get("direction") in ("outbound", "outbound-api")
    number = meta.get("campaign_to") or (ctx.called if outbound else ctx.caller)
    if add is None:
        raise ToolFailed("no do-not-call list on this server (it has no store): the number was not added")
    if not number:
        raise ToolFailed("the other party's number is unknown: it was not added to the do-not-call list")
    await add(str(number), "opt_out")
    ctx.request_action("end_call", reason=f"opt-out: {reason}" if reason else "opt-out")
    return {"action": "opt_out", "number": number,
            "sentence": "Done: this number will not be called again. Apologise for the trouble and say goodbye."}


# What people say to ask for it (the side-effect policy's keyword check, `duetaspan.router.intent`). Most of it is
# said as a negation of calling ("never call me again", "don't call me"), which the check would otherwise read
# as a refusal; "never mind, call me again" and "I don't want to opt out" are still refused.
PHRASES = ("never call", "don't call", "dont call", "do not call", "do-not-call", "stop calling", "quit calling",
           "no more calls", "take me off", "remove me", "unsubscribe", "opt out", "don't contact", "stop contacting")  # fmt: skip
opt_out.spec.meta["phrases"] = list(PHRASES)

__all__ = ["PHRASES", "opt_out"]
