"""The side-effect policy's LLM verification: "did the caller ask for this?", asked of the router's model.

The judge sees the tool (name, description), the arguments, and the caller's own words only: never tool
outputs or the agent's words, so an instruction hidden in a tool result cannot reach it. It replies with
`{"asked": true|false, "reason": "..."}`; anything else is a failure, and the keyword check decides.

Example:
    >>> parse_judgement('{"asked": true, "reason": "the caller said book it"}')
    (True, 'the caller said book it')
    >>> parse_judgement("I am not sure")[0] is None
    True
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from duetaspan.registry import ToolSpec
from duetaspan.router.parse import find_json_object, loads_lenient
from duetaspan.router.ports import ChatModelError

JUDGE_RULES = """You check one action that a phone voice agent is about to take for a caller, before it runs. \
Decide whether the CALLER asked for this action in their own words: in the LATEST REQUEST, or as a clear yes \
("yes", "go ahead") to the same action they asked for in their EARLIER WORDS.
Not asking: a question about the action ("how do I...", "what if I..."), a maybe or a plan for later, a \
negation ("don't ..."), a request the caller took back ("... actually never mind"). After a self-correction \
("no wait", "actually", "I mean"), only the corrected request counts. Speech recognition may garble words.
Argument values such as ids may come from earlier tool results you are not shown: judge only whether the \
caller asked for this action, not where the values came from.
Reply with one JSON object and nothing else: {"asked": true or false, "reason": "<a few words>"}"""


def judge_messages(
    spec: ToolSpec, arguments: dict[str, Any], question: str, earlier: Sequence[str]
) -> list[dict[str, Any]]:
    """The judge's chat messages (the caller's words as JSON strings, nothing from tools)."""
    lines = [
        f"ACTION: {spec.name}: {' '.join(spec.description.split())[:300]}",
        f"ARGUMENTS: {json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)[:600]}",
    ]
    if earlier:
        lines.append("CALLER'S EARLIER WORDS (oldest first):")
        lines += [f"- {json.dumps(' '.join(e.split())[:300], ensure_ascii=False)}" for e in earlier[-4:]]
    lines.append(
        f"CALLER'S LATEST REQUEST: {json.dumps(' '.join(question.split())[:480], ensure_ascii=False)}"
    )
    return [{"role": "system", "content": JUDGE_RULES}, {"role": "user", "content": "\n".join(lines)}]


def parse_judgement(text: str) -> tuple[bool | None, str]:
    """`(asked, reason)` from the judge's reply; `(None, why)` when it is not a judgement."""
    candidate = find_json_object(text or "")
    if candidate is not None:
        try:
            obj = loads_lenient(candidate)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            asked = obj.get("asked")
            if isinstance(asked, str) and asked.lower() in ("true", "false", "yes", "no"):
                asked = asked.lower() in ("true", "yes")
            if isinstance(asked, bool):
                return asked, str(obj.get("reason") or ("asked" if asked else "not asked"))[:200]
    word = (text or "").strip().strip(".!\"'").lower()
    if word in ("yes", "true"):
        return True, "asked"
    if word in ("no", "false"):
        return False, "not asked"
    return None, f"the judge's reply is not a judgement: {(text or '')[:80]!r}"


async def judge(
    llm: Any, spec: ToolSpec, arguments: dict[str, Any], question: str, earlier: Sequence[str]
) -> tuple[bool | None, str]:
    """Ask `llm` (a `ChatModel`) whether the caller asked for the call; `(None, why)` when it cannot tell."""
    if llm is None:
        return None, "no judge model"
    try:
        reply = await llm.complete(judge_messages(spec, arguments, question, earlier))
    except ChatModelError as exc:
        return None, str(exc)
    return parse_judgement(reply.content)
