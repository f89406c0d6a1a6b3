"""Real-router mode and the LLM judge.

`DUETASPAN_TEST_ROUTER=real` makes `scripted_call(..., llm=...)` keep the agent's own configured router (its
`[router]` base URL, model and key) instead of pointing it at the `ScriptedLLM`; the ASR stays scripted, so
the question is still what the test says. Without the router's key the test is skipped, saying which
variable to set.

`await outcome.judge("books a table for four")` asks an OpenAI-compatible judge model whether the retrieval
did that: `DUETASPAN_JUDGE_BASE_URL` (default OpenAI), `DUETASPAN_JUDGE_MODEL` (default gpt-4.1-mini), key
`DUETASPAN_JUDGE_API_KEY` or else `OPENAI_API_KEY`; without a key the test is skipped with that reason.

Example:
    >>> import os
    >>> os.environ.pop("DUETASPAN_TEST_ROUTER", None) and None
    >>> router_mode()
    'scripted'
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

MODE_ENV = "DUETASPAN_TEST_ROUTER"
JUDGE_PROMPT = """You judge one step of a phone call handled by a voice agent. The caller said something, the \
agent's router chose a tool (or answered, or declined), and a short reference line was given to the agent \
to speak from. Decide whether this step satisfies the criterion. Reply with JSON only: \
{"pass": true or false, "reason": "one sentence"}."""


def router_mode() -> str:
    """ "real" when `DUETASPAN_TEST_ROUTER=real`, else "scripted"."""
    return "real" if os.environ.get(MODE_ENV, "").strip().lower() == "real" else "scripted"


def skip(reason: str) -> Any:
    """Skip the running test (pytest), or fail clearly outside pytest."""
    try:
        import pytest
    except ImportError:  # pragma: no cover - the testing extra brings pytest
        raise RuntimeError(reason) from None
    pytest.skip(reason)


def check_real_router(config: Any) -> None:
    """Skip unless the agent's configured router can be reached with a key (real-router mode)."""
    router = config.router
    if router.api_key_env and not router.api_key():
        skip(
            f"{MODE_ENV}=real: the agent's router ({router.base_url}, model {router.model}) needs "
            f"${router.api_key_env}, which is not set"
        )


def _judge_settings() -> tuple[str, str, str]:
    key = os.environ.get("DUETASPAN_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if not key:
        skip(
            "outcome.judge() needs a judge model: set DUETASPAN_JUDGE_API_KEY or OPENAI_API_KEY "
            "(DUETASPAN_JUDGE_BASE_URL and DUETASPAN_JUDGE_MODEL pick the endpoint and model)"
        )
    base_url = os.environ.get("DUETASPAN_JUDGE_BASE_URL") or "https://api.openai.com/v1"
    return base_url, os.environ.get("DUETASPAN_JUDGE_MODEL") or "gpt-4.1-mini", str(key)


def parse_verdict(text: str) -> tuple[bool, str]:
    """The judge's `{"pass": ..., "reason": ...}` (code fences and prose around it tolerated)."""
    match = re.search(r"\{.*\}", text or "", re.S)
    try:
        data = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict) or "pass" not in data:
        return False, f"the judge's reply is not a verdict: {text!r}"
    return bool(data["pass"]), str(data.get("reason", ""))


async def judge(what_happened: str, criterion: str) -> tuple[bool, str]:
    """(passed, the judge's reason) for `criterion` on a retrieval, described by `Outcome.describe()`."""
    from openai import AsyncOpenAI, OpenAIError

    base_url, model, key = _judge_settings()
    step = f"Criterion: {criterion}\n\nWhat happened:\n{what_happened}"
    client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=60.0, max_retries=1)
    try:
        reply = await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": JUDGE_PROMPT}, {"role": "user", "content": step}],
            temperature=0,
        )
    except OpenAIError as exc:
        raise AssertionError(f"the judge model at {base_url} failed: {exc}") from exc
    finally:
        await client.close()
    return parse_verdict(reply.choices[0].message.content or "")


__all__ = ["MODE_ENV", "check_real_router", "judge", "parse_verdict", "router_mode"]
