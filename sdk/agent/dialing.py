"""Where `agent.dial(to)` goes: a `sip:` / `sips:` URI to the SIP endpoint `serve(sip=...)` runs in this
process, an E.164 number (`+15551234567`) to the Twilio service `serve(twilio=True)` runs
(`duetaspan.adapters.twilio.outbound`: Twilio's REST API dials it with a `<Connect><Stream>` back to this
server). Both return a result with `outcome` (answered, busy, no-answer, failed) and `summary()`.

Example:
    >>> # result = await place_call(agent, "+15551234567", ring_timeout_s=30)
"""

from __future__ import annotations

import re
from typing import Any

from duetaspan.errors import ConfigError

E164 = re.compile(r"^\+[1-9]\d{6,14}$")


def dial_slots(agent: Any) -> int:
    """The calls `agent` can place now: its free slots, and no more than its SIP endpoint would accept. A SIP
    call keeps its endpoint slot a little past its `ended` event, until its handler, media and RTP port are
    closed; a dial in that window is refused before any INVITE (a campaign's claim kept as `not_dialled`)."""
    free = int(agent.free_slots)
    if agent.sip_endpoint is not None:
        free = min(free, int(agent.sip_endpoint.free_slots))
    return free


def carrier_of(to: str) -> str:
    """`sip` for a SIP URI, `twilio` for an E.164 number; ConfigError otherwise."""
    if to.startswith(("sip:", "sips:")):
        return "sip"
    if E164.match(to):
        return "twilio"
    raise ConfigError(f"agent.dial({to!r}): a SIP URI (sip:USER@HOST) or an E.164 number (+15551234567)")


async def place_call(
    agent: Any, to: str, *, caller: str | None = None, ring_timeout_s: float | None = None,
    detect: bool | None = None, params: Any = None, goal: str | None = None,
) -> Any:
    """Place the call on the carrier `to` names (the module docstring); `params` go into the answered call's
    `CallInfo.params` (a campaign's id and the row's variables as `profile`), on SIP and Twilio alike; `goal`
    (a phone menu's target, "reach billing": `duetaspan.outbound.ivr`) goes there as `ivr_goal` and turns
    answer detection on unless `detect` says otherwise."""
    if goal is not None and " ".join(str(goal).split()):
        params = {**dict(params or {}), "ivr_goal": " ".join(str(goal).split())[:300]}
        detect = True if detect is None else detect  # a menu is navigated by the answer gate
    if carrier_of(to) == "sip":
        if agent.sip_endpoint is None:
            raise ConfigError("agent.dial(sip:...) needs the SIP endpoint: run agent.serve(sip=True) in this process first")
        return await agent.sip_endpoint.dial(to, caller=caller, ring_timeout_s=ring_timeout_s, detect=detect,
                                             params=params)  # fmt: skip
    if agent.twilio_service is None:
        raise ConfigError("agent.dial(+number) needs Twilio: run agent.serve(twilio=True) in this process first")
    return await agent.twilio_service.dialer.dial(to, caller=caller, ring_timeout_s=ring_timeout_s, detect=detect,
                                                  params=params)  # fmt: skip


__all__ = ["E164", "carrier_of", "place_call"]
