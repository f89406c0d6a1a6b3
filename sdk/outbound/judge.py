"""The LLM second opinion on who answered (`[outbound] second_opinion = "llm"`): the router's LLM reads the
transcript of the call's first seconds when the phrase rules (`duetaspan.outbound.phrases`) found nothing.

Phrases first: they are fast and deterministic. Only when none matched, the transcript is not empty and the
audio said `human` or `voicemail`, `AnswerJudge.weigh` asks the router's `ChatModel` (one request, at most
`timeout_s`) to classify who answered as one of `ANSWERS`, through one tool (`classify_answer`, its one
argument an enum; with the router's `mode = "json"`, a JSON object `{"answered_by": ...}` instead). Its answer
is applied as a phrase's is: a machine class overturns an audio `human` (`source: "llm"`), `ivr` or
`screening` refine a `voicemail`; `human` or `unknown` change nothing. An error, a timeout or an answer
outside the format leaves the verdict as it was (one warning; never raised into the call).

Example:
    >>> judge = AnswerJudge(llm=None)
    >>> judge.tool()["function"]["parameters"]["properties"]["answered_by"]["enum"]
    ['human', 'voicemail', 'ivr', 'screening', 'unknown']
    >>> judge.parse('{"answered_by": "voicemail"}')
    'voicemail'
    >>> judge.parse("It sounds like a voicemail.") is None
    True
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from duetaspan.outbound.phrases import phrase_verdict
from duetaspan.outbound.verdicts import Verdict

log = logging.getLogger("duetaspan.outbound")

ANSWERS = ("human", "voicemail", "ivr", "screening", "unknown")
TOOL = "classify_answer"
TIMEOUT_S = 3.0  # the LLM's limit: the call goes on meanwhile (a person is already talking to the agent)
CONFIDENCE = 0.85

RULES = f"""An automated phone call was just answered. You are given what the audio classifier decided from \
the sound and the transcript of the first seconds (speech recognition: words may be garbled). Decide who \
answered:
- human: a person picked up and is talking live ("hello?", "yes, this is Dana");
- voicemail: a recorded greeting or an answering machine, in any wording ("Dana's phone, I'm out, talk soon", \
"our office is closed");
- ivr: a phone menu, an automated attendant or hold music;
- screening: a call screener (a person's assistant or the phone itself) asking who is calling or why;
- unknown: you cannot tell.
Call {TOOL} exactly once with your answer, and say nothing else."""
JSON_RULES = RULES.replace(f"Call {TOOL} exactly once with your answer, and say nothing else.",
                           'Reply with one JSON object and nothing else: {"answered_by": "<one of human, voicemail, '
                           'ivr, screening, unknown>"}')  # fmt: skip


class AnswerJudge:
    """See the module docstring.

    Args:
        llm: the router's `ChatModel` (`complete(messages, tools=...)`).
        mode: the router's mode: "native" (the tool) or "json" (a JSON object in the reply).
        timeout_s: the LLM's time limit.
    """

    def __init__(self, llm: Any, *, mode: str = "native", timeout_s: float = TIMEOUT_S) -> None:
        self.llm, self.mode, self.timeout_s = llm, mode, timeout_s

    @staticmethod
    def wanted(audio: Verdict, transcript: str) -> bool:
        """Whether to ask: the audio said `human` or `voicemail`, words were heard and no phrase matched."""
        return audio.verdict in ("human", "voicemail") and bool(transcript.strip()) and not phrase_verdict(transcript)

    def tool(self) -> dict[str, Any]:
        params = {"type": "object", "additionalProperties": False, "required": ["answered_by"],
                  "properties": {"answered_by": {"type": "string", "enum": list(ANSWERS)}}}  # fmt: skip
        return {"type": "function", "function": {"name": TOOL, "parameters": params,
                "description": "Say who answered the call: one of " + ", ".join(ANSWERS) + "."}}  # fmt: skip

    def messages(self, audio: Verdict, transcript: str) -> list[dict[str, Any]]:
        said = json.dumps(" ".join(transcript.split())[:1000], ensure_ascii=False)
        user = f"AUDIO CLASSIFIER: {audio.verdict} ({audio.reason or 'no reason given'})\nTRANSCRIPT: {said}"
        return [{"role": "system", "content": JSON_RULES if self.mode == "json" else RULES},
                {"role": "user", "content": user}]  # fmt: skip

    @staticmethod
    def parse(raw: str) -> str | None:
        """The class in a JSON object `{"answered_by": <one of ANSWERS>}` (a code fence around it allowed), else
        None."""
        text = raw.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        answer = obj.get("answered_by") if isinstance(obj, dict) else None
        return answer if isinstance(answer, str) and answer in ANSWERS else None

    async def classify(self, audio: Verdict, transcript: str) -> str | None:
        """The LLM's class for `transcript`, or None (failed, timed out or answered outside the format: one
        warning)."""
        if self.llm is None:
            return None
        tools = None if self.mode == "json" else [self.tool()]
        try:
            async with asyncio.timeout(self.timeout_s):
                reply = await self.llm.complete(self.messages(audio, transcript), tools=tools)
        except TimeoutError:
            log.warning("answer: the router's LLM gave no second opinion within %g s; keeping %s", self.timeout_s,
                        audio.verdict)  # fmt: skip
            return None
        except Exception as exc:  # any failure of the LLM: the audio's verdict stands, the call goes on
            log.warning("answer: the router's LLM failed as second opinion (%s); keeping %s",
                        exc or type(exc).__name__, audio.verdict)  # fmt: skip
            return None
        calls = list(getattr(reply, "tool_calls", None) or [])
        if tools and len(calls) == 1 and calls[0].name == TOOL:
            answer = self.parse(calls[0].arguments_json or "")
        elif not tools and not calls:
            answer = self.parse(getattr(reply, "content", "") or "")
        else:
            answer = None
        if answer is None:
            got = [c.name for c in calls] or (getattr(reply, "content", "") or "")[:80]
            log.warning("answer: the router's LLM answered outside the format (%r); keeping %s", got, audio.verdict)
        return answer

    async def weigh(self, audio: Verdict, transcript: str, *, at: Callable[[], float]) -> Verdict:
        """`audio` (the phrases' verdict, the transcript on it) as the LLM's class changes it (the module
        docstring); `at()` is the call's time when the LLM answered."""
        answer = await self.classify(audio, transcript)
        if answer is None or answer in ("human", "unknown", audio.verdict):
            return audio
        if audio.verdict == "voicemail" and answer not in ("ivr", "screening"):
            return audio
        how = "overturns" if audio.verdict == "human" else "refines"
        return Verdict(answer, CONFIDENCE, at(), source="llm", transcript=transcript,
                       reason=f"the router's LLM says {answer} ({how} the audio's {audio.verdict})")  # fmt: skip


__all__ = ["ANSWERS", "TIMEOUT_S", "TOOL", "AnswerJudge"]
