"""Text mode (`duetaspan eval --text`): no audio and no duplex model. Each routed caller turn goes through
the agent's real router (its LLM, prompt, tools and side-effect policy) exactly as a captured question does
at a `<ret>`: the call's Context DB holds the earlier turns and tool results, and when a tool ran the router
is asked again with the result recorded (as the model's next `<ret>` would), so chained calls happen until
the router stops calling tools or `max_chain` rounds were routed for the turn. A reply with several tool
calls runs them all; a call the re-ask repeats (same tool, same real arguments) is not run again.

Example:
    >>> async def main(config, suite):                           # doctest: +SKIP
    ...     async with TextRunner(config, suite) as runner:
    ...         run = await runner.run(suite.scenarios[0])
    ...     print([c.tool for c in run.calls], run.answer)
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from duetaspan.adapters.llm import ChatClient
from duetaspan.config import AgentConfig
from duetaspan.eval.result import ScenarioRun
from duetaspan.eval.scenario import Scenario, Suite
from duetaspan.eval.tools import CallLog, mock_tools
from duetaspan.registry import CallContext, ToolRegistry
from duetaspan.router import ContextDB, Router
from duetaspan.router.policy import SideEffectPolicy


class TextRunner:
    """Routes scenarios' caller turns through the agent's router (see the module docstring).

    Args:
        config: the agent's configuration (router, tools, MCP servers, profile).
        suite: the scenarios; its mock tools, when it declares any, replace the agent's tools.
        max_chain: most tool calls routed for one caller turn.
        timeout_s: a scenario still running after this long is stopped and recorded as an error.
    """

    def __init__(
        self, config: AgentConfig, suite: Suite, *, max_chain: int = 4, timeout_s: float = 120.0
    ) -> None:
        self.config = config
        self.suite = suite
        self.max_chain = max_chain
        self.timeout_s = timeout_s
        self.router: Router | None = None
        self.log: CallLog | None = None
        self._tools_cm: Any = None

    async def start(self) -> None:
        """Build the registry (mock tools, or the agent's tools with its MCP servers) and the router."""
        if self.suite.tools:
            registry = ToolRegistry(
                mock_tools(self.suite.tools, fdb_v3=self.suite.format == "fdb-v3"),
                default_timeout=self.config.tools.default_timeout_s,
            )
        else:
            from duetaspan.tools.loader import agent_tools

            self._tools_cm = agent_tools(self.config)
            registry = await self._tools_cm.__aenter__()
        self.log = CallLog.wrap(registry)
        self.router = Router(
            registry,
            ChatClient.from_config(self.config.router),
            mode=self.config.router.mode,
            max_reference_chars=4 * self.config.retrieval.max_reference_tokens,
            policy=SideEffectPolicy.from_config(
                self.config.router.side_effects,
                default_mode=self.config.router.side_effect_mode(),
            ),
        )

    async def close(self) -> None:
        if self.router is not None:
            await self.router.aclose()
            self.router = None
        if self._tools_cm is not None:
            await self._tools_cm.__aexit__(None, None, None)
            self._tools_cm = None

    async def __aenter__(self) -> TextRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, scenario: Scenario) -> ScenarioRun:
        """One scenario; LLM failures and timeouts are recorded in the result, never raised."""
        assert self.router is not None and self.log is not None, "start() the runner first"
        call_id = f"eval-{scenario.id}-{uuid.uuid4().hex[:8]}"
        ctx = CallContext(call_id=call_id, profile=dict(self.config.profile))
        db = ContextDB(ctx=ctx)
        run = ScenarioRun(scenario.id)
        self.log.start(call_id)
        started = time.monotonic()
        turn_end: float | None = None
        acted: set[str] = set()  # side effects that ran in this scenario, as the live call keeps them
        try:
            async with asyncio.timeout(self.timeout_s):
                for turn in scenario.turns:
                    db.add_utterance(turn.text)
                    if turn.route:
                        turn_end = time.monotonic()
                        await self._route_turn(turn.text, db, ctx, run, acted)
                        if run.error:
                            break
                    if turn.agent:
                        db.add_agent_text(turn.agent + " ")
        except TimeoutError:
            run.error = f"timed out after {self.timeout_s:g} s"
        run.elapsed_s = time.monotonic() - started
        run.calls = self.log.calls(call_id)
        if turn_end is not None:  # to the first call the last routed turn made
            after = [c.t for c in run.calls if c.t >= turn_end - started]
            run.latency_s = after[0] - (turn_end - started) if after else None
        return run

    async def _route_turn(
        self, text: str, db: ContextDB, ctx: CallContext, run: ScenarioRun, acted: set[str]
    ) -> None:
        """Route one caller turn, asking again after each round of tool calls (see the module docstring).

        The calls made in this turn are passed to the router as `skip`, keyed on their real (unredacted)
        arguments: a call the re-ask provokes again is recognised before it runs, so a booking never runs
        twice and a repeat is never logged (or scored) as a call; only new calls continue the chain. Side
        effects that ran in an earlier turn of the scenario (`acted`) are not run again either, as in a call.
        """
        assert self.router is not None
        made: set[str] = set()
        for _ in range(self.max_chain):
            result = await self.router.route(text, db=db, ctx=ctx, skip=made | acted)
            run.trace.append(
                {
                    "question": text,
                    "decision": result.decision,
                    "tool": result.tool,
                    "arguments": result.arguments,
                    "reference": result.reference,
                    "llm_ms": round(result.llm_ms, 1),
                    "detail": result.detail,
                    "calls": [
                        {"tool": c.tool, "arguments": c.arguments, "decision": c.decision, "detail": c.detail}
                        for c in result.calls
                    ],
                }
            )
            if result.decision == "error":
                run.error = f"router LLM failed: {result.detail}"
                return
            if result.reference:
                run.answer_parts.append(result.reference)
            fresh = False
            for call in result.ran:
                made.add(call.key)
                if call.tool_result is not None and call.tool_result.ok and call.tool_result.side_effect:
                    acted.add(call.key)
                if call.tool_result is not None and call.tool_result.ok and call.reference:
                    # recorded as the retrieval manager does after a span
                    db.add_tool_turn(call.tool, call.arguments, call.reference)
                    fresh = True
            if not fresh:
                return  # no (successful) new tool call: the chain ends
