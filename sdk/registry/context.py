"""The per-call context handed to tools, and the call-control actions tools request through it.

A tool asks for it by annotating a parameter with `CallContext`; the parameter is injected and kept out of
the JSON schema. Telephony adapters consume `CallContext.actions` (or get each one live through `on_action`)
and carry them out: hang up, transfer.

Example:
    >>> from duetaspan.registry import CallContext, tool
    >>> @tool(side_effect=True)
    ... async def hang_up(ctx: CallContext) -> str:
    ...     '''End the call.'''
    ...     ctx.request_action("end_call", reason="caller said goodbye")
    ...     return "Ending the call."
    >>> ctx = CallContext(call_id="CA123", on_action=lambda a: print("adapter got", a.kind))
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from duetaspan.registry.effects import SideEffectLedger


@dataclass
class Turn:
    """One line of the conversation so far: `role` is "user", "agent" or "tool"."""

    role: str
    text: str
    t: float | None = None


@dataclass
class CallAction:
    """A call-control request made by a tool, e.g. `CallAction("transfer_call", target="+15551234567")`.

    Kinds used by the built-in tools: "end_call" (params: none) and "transfer_call" (target: a phone number
    or SIP URI). `t` is the wall-clock time of the request.
    """

    kind: str
    target: str | None = None
    reason: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    t: float = field(default_factory=time.time)


@dataclass
class CallContext:
    """What a tool may know about the call it serves. One instance per call, owned by the call.

    Attributes:
        call_id: the transport's id for the call (Twilio CallSid, WebRTC peer id, or a random hex id).
        caller: the caller's number (E.164) when known.
        called: the dialled number when known.
        profile: per-call facts (name, city, timezone, ...) from config, `<Parameter>`s or the Context DB.
        dtmf: DTMF digits pressed so far, in order.
        transcript: the conversation so far.
        actions: call-control actions requested by tools, in order; the telephony adapter carries them out.
        on_action: called synchronously with each new action, on the thread that requested it (the event loop
            for async tools). It must not block: schedule the real work (e.g. `loop.create_task`).
        metadata: anything else the application wants tools to see.
        effects: the call's side-effect tool calls by idempotency key (one booking runs once per call).
        on_late_result: called with the `ToolResult` of a side-effect call that finished after its caller
            stopped waiting (the retrieval's deadline): the call's retrieval records it.
    """

    call_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    caller: str | None = None
    called: str | None = None
    profile: dict[str, Any] = field(default_factory=dict)
    dtmf: str = ""
    transcript: list[Turn] = field(default_factory=list)
    actions: list[CallAction] = field(default_factory=list)
    on_action: Callable[[CallAction], Any] | None = field(default=None, repr=False)
    metadata: dict[str, Any] = field(default_factory=dict)
    effects: SideEffectLedger = field(default_factory=SideEffectLedger, repr=False, compare=False)
    on_late_result: Callable[[Any], Any] | None = field(default=None, repr=False, compare=False)

    def request_action(self, kind: str, target: str | None = None, reason: str | None = None, **params: Any):
        """Record a call-control action and notify `on_action`; returns the `CallAction`."""
        action = CallAction(kind=kind, target=target, reason=reason, params=dict(params))
        self.actions.append(action)
        if self.on_action is not None:
            self.on_action(action)
        return action


def act_on_actions(context: Any, act: Callable[[CallAction], Coroutine[Any, Any, None]]) -> bool:
    """Have every action a tool requests on `context` (`end_call`, `transfer_call`, `send_dtmf`...) run as
    `act(action)` on the running event loop, whichever thread the tool ran on; False when `context` takes no
    actions (None, or not a `CallContext`). What telephony adapters bind to their call at its start."""
    if context is None or not hasattr(context, "on_action"):
        return False
    loop = asyncio.get_running_loop()
    tasks: set[asyncio.Task[None]] = set()  # kept until done (a task nobody references can be collected)

    def on_action(action: CallAction) -> None:
        def start() -> None:
            task = loop.create_task(act(action))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        loop.call_soon_threadsafe(start)  # tools may run on a worker thread

    context.on_action = on_action
    return True
