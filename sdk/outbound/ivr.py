"""Phone-menu navigation toward a call's goal (`agent.dial(..., goal="reach billing")`).

When the answer gate (`duetaspan.outbound.gate`) is in `ivr` (a menu, hold music) and the call has a goal, it
transcribes the menu heard since the last key press (at most `MENU_MAX_S`), once the line has been quiet for
`MENU_PAUSE_S` after it, and `MenuNavigator.decide(menu, state=...)` asks the router's LLM (a `ChatModel`)
with the goal and the menu, offering only the built-in `send_dtmf`. What the LLM picks goes through the
side-effect policy's own path for goal presses (`SideEffectPolicy.check_goal`: only `send_dtmf`, only 0-9 * #,
only in `ivr`, only with a goal), never the caller's-request check, and every decision is recorded
(`MenuNavigator.decisions`, `Press`). An allowed press runs the `send_dtmf` tool itself on the call's
`CallContext`, so the keys reach the line as any `send_dtmf` does (RFC 4733 events paced in real time on SIP,
in-band tones on Twilio).

Bounds: `max_presses` keys pressed at most (the next press the menu asks for ends the call: `ivr_loop`), and
the same menu (transcripts alike by `difflib`, `SIMILAR`) heard `LOOP_REPEATS` times after a press is a loop
(`ivr_loop`). An LLM that fails, times out or picks no key leaves the call waiting (logged).

Example:
    >>> nav = MenuNavigator("reach billing", llm=None, press=None)
    >>> nav.messages("For billing, press one.")[1]["content"].splitlines()[0]
    'GOAL: "reach billing"'
    >>> nav.tool()["function"]["name"]
    'send_dtmf'
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger("duetaspan.outbound")

MAX_PRESSES = 6  # keys pressed per call at most
LOOP_REPEATS = 3  # the same menu heard this many times after pressing: a loop
SIMILAR = 0.9  # two menu transcripts this alike (difflib ratio) are the same menu
MENU_MAX_S = 30.0  # the menu audio transcribed at most (the latest seconds since the last press)
MENU_PAUSE_S = 1.0  # quiet after the menu's words before the navigator decides

NAV_RULES = """You navigate a phone menu (an IVR) for an automated call, toward the call's GOAL.
You are given the menu as transcribed by speech recognition (words may be garbled).
If the menu offers an option that leads toward the GOAL, call send_dtmf with the keys for it (0-9, *, #).
If it offers none yet (the menu is not finished, hold music, "please hold", a recording), call no tool and \
reply WAIT. Never press keys that the menu did not offer."""


@dataclasses.dataclass(frozen=True)
class Press:
    """One navigation decision: the menu heard, the keys the LLM chose (None: none), whether the policy
    allowed them and why (`how` "goal": the goal-press path)."""

    at_s: float
    menu: str
    tool: str | None
    digits: str | None
    allowed: bool
    reason: str
    how: str = "goal"

    def as_json(self) -> dict[str, Any]:
        return {"at_s": round(self.at_s, 3), "menu": self.menu[:500], "tool": self.tool, "digits": self.digits,
                "allowed": self.allowed, "reason": self.reason, "how": self.how}  # fmt: skip


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z*#]+", " ", text.lower()).split())


class MenuNavigator:
    """See the module docstring.

    Args:
        goal: what the call should reach ("reach billing").
        llm: the router's `ChatModel` (`complete(messages, tools=...)`).
        press: runs the keys on the call (`send_dtmf` through the call's context); awaited.
        policy: a `duetaspan.router.policy.SideEffectPolicy` (default: a fresh one).
        max_presses: keys pressed per call at most.
        timeout_s: the LLM's time limit per menu.
    """

    def __init__(
        self,
        goal: str,
        llm: Any,
        press: Callable[[str], Awaitable[Any]] | None,
        *,
        policy: Any = None,
        max_presses: int = MAX_PRESSES,
        timeout_s: float = 8.0,
    ) -> None:
        if policy is None:
            from duetaspan.router.policy import SideEffectPolicy

            policy = SideEffectPolicy()
        self.goal, self.llm, self.press, self.policy = goal, llm, press, policy
        self.max_presses, self.timeout_s = max_presses, timeout_s
        self.presses = 0
        self.pressed: list[str] = []
        self.decisions: list[Press] = []
        self._after_press: list[str] = []  # menus heard after a press, normalised

    def tool(self) -> dict[str, Any]:
        """`send_dtmf` as the navigator offers it (its own parameters; the description says what it is for)."""
        from duetaspan.tools.call_control import send_dtmf

        spec = send_dtmf.spec
        return {"type": "function", "function": {"name": spec.name, "parameters": spec.parameters,
                "description": "Press keys on the phone line to choose a menu option: 0-9, *, #."}}  # fmt: skip

    def messages(self, menu: str) -> list[dict[str, Any]]:
        lines = [f"GOAL: {json.dumps(' '.join(self.goal.split())[:300], ensure_ascii=False)}"]
        if self.pressed:
            lines.append(f"KEYS PRESSED SO FAR (oldest first): {', '.join(self.pressed)}")
        lines.append(f"MENU: {json.dumps(' '.join(menu.split())[:1500], ensure_ascii=False)}")
        return [{"role": "system", "content": NAV_RULES}, {"role": "user", "content": "\n".join(lines)}]

    def loop_heard(self, menu: str) -> bool:
        """Note `menu` (after a press); True when it is the `LOOP_REPEATS`th time the same menu came back."""
        if not self.presses:
            return False
        key = _norm(menu)
        same = sum(1 for m in self._after_press if difflib.SequenceMatcher(None, m, key).ratio() >= SIMILAR)
        self._after_press.append(key)
        return same + 1 >= LOOP_REPEATS

    async def choose(self, menu: str) -> tuple[str, dict[str, Any]] | None:
        """`(tool name, arguments)` the LLM called for `menu`, or None (it failed or chose no key: logged)."""
        if self.llm is None:
            log.warning("ivr: no router LLM to navigate the menu toward %r; waiting", self.goal)
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                reply = await self.llm.complete(self.messages(menu), tools=[self.tool()])
        except Exception as exc:  # any failure of the LLM: the call keeps waiting, it never crashes
            log.warning("ivr: the router's LLM failed on the menu (%s); waiting", exc or type(exc).__name__)
            return None
        calls = list(getattr(reply, "tool_calls", None) or [])
        if not calls:
            log.info("ivr: no key chosen for %r (the LLM said %r); waiting", self.goal, (reply.content or "")[:80])
            return None
        call = calls[0]
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            log.warning("ivr: the LLM's %s arguments are not a JSON object (%r); waiting", call.name,
                        (call.arguments_json or "")[:80])  # fmt: skip
            return None
        return call.name, arguments

    async def decide(self, menu: str, *, state: Callable[[], str], at: Callable[[], float]) -> Press | None:
        """Ask the LLM about `menu`, check its choice against the goal-press policy (with the gate's state
        when the answer came: `state()`), press the keys when allowed. The decision, or None when no key was
        chosen. Raises `PressLimit` when the menu asks for a key past `max_presses`."""
        choice = await self.choose(menu)
        if choice is None:
            return None
        name, arguments = choice
        if self.presses >= self.max_presses:
            raise PressLimit(f"the menu still asks for keys after {self.presses} presses toward {self.goal!r}")
        verdict = self.policy.check_goal(name, arguments, state=state(), goal=self.goal)
        digits = arguments.get("digits") if isinstance(arguments.get("digits"), str) else None
        decision = Press(at(), menu, name, digits, verdict.allowed, verdict.reason, verdict.how)
        self.decisions.append(decision)
        if not verdict.allowed:
            log.warning("ivr: refused %s(%r): %s", name, arguments, verdict.reason)
            return decision
        keys = re.sub(r"[\s,-]", "", digits or "")
        log.info("ivr: pressing %s toward %r (%s)", keys, self.goal, verdict.reason)
        self.presses += 1
        self.pressed.append(keys)
        if self.press is not None:
            await self.press(keys)
        return decision


class PressLimit(Exception):
    """The menu asked for more keys than `max_presses`."""


def dtmf_press(context: Any) -> Callable[[str], Awaitable[Any]]:
    """Keys pressed by the built-in `send_dtmf` tool's own function on the call's `context`: its action
    reaches the line as any `send_dtmf` call's does (the SIP or Twilio adapter's action handler). Not through
    `ToolRegistry.call`, which runs a side-effect call once per call and arguments: a menu may need "1" twice."""
    from duetaspan.tools.call_control import send_dtmf

    async def press(keys: str) -> Any:
        try:
            return await send_dtmf.fn(digits=keys, ctx=context)
        except Exception as exc:  # the tool refuses keys it cannot press: logged, the call waits
            log.warning("ivr: send_dtmf %s failed: %s", keys, exc)
            return None

    return press


__all__ = ["LOOP_REPEATS", "MAX_PRESSES", "MENU_MAX_S", "MENU_PAUSE_S", "MenuNavigator", "Press", "PressLimit",
           "dtmf_press"]  # fmt: skip
