"""End-of-call analysis (`[analysis]`): after the call ends, the router's LLM reads the call's two-sided
transcript and tool results and returns a summary, a yes/no answer to the success question, and fields
extracted to a schema (a pydantic model, or a JSON Schema written in TOML).

The request offers one tool, `record_call_analysis`, whose parameters are exactly what is wanted, and asks
the model to call it (a model that answers with the JSON as text is read too). The answer is validated:
the fields against the schema, the summary as text, the success check as a boolean. An invalid answer is
retried once with the validation error shown to the model; a second invalid answer (or a failing LLM) is
recorded as `{"error": ..., "attempts": 2}`: a result is either whole or absent, never half saved.

Example:
    >>> a = Analyzer(summary=True, success_question="Did the caller book?",
    ...              schema={"type": "object", "properties": {"people": {"type": "integer"}},
    ...                      "required": ["people"]})
    >>> sorted(a.parameters()["properties"])
    ['fields', 'success', 'summary']
    >>> a.validate({"summary": "Booked.", "success": True, "fields": {"people": 4}})
    {'summary': 'Booked.', 'success': True, 'fields': {'people': 4}}
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import jsonschema
from pydantic import BaseModel, ValidationError

from duetaspan.errors import ConfigError
from duetaspan.pipeline.transcript import as_text
from duetaspan.router.ports import ChatModel, ChatModelError, ChatReply

log = logging.getLogger(__name__)
TOOL = "record_call_analysis"
ATTEMPTS = 2  # the first answer, and one retry with the validation error


class AnalysisInvalid(ValueError):
    """The model's answer does not fit the schema (the message says where)."""


def load_model(path: str) -> type[BaseModel]:
    """The pydantic model named `package.module:ClassName` (`[analysis] model`)."""
    module_name, _, name = path.partition(":")
    try:
        model = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"[analysis] model = {path!r}: cannot import it: {exc}") from None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"[analysis] model = {path!r} is not a pydantic model class")
    return model


class Analyzer:
    """Builds the analysis request, validates answers, and runs it against a `ChatModel`."""

    def __init__(
        self,
        *,
        summary: bool = True,
        success_question: str | None = None,
        schema: Mapping[str, Any] | type[BaseModel] | None = None,
        instructions: str = "",
        timeout_s: float = 60.0,
    ) -> None:
        self.summary = summary
        self.success_question = success_question
        self.model: type[BaseModel] | None = schema if isinstance(schema, type) else None
        self.schema: dict[str, Any] | None = (
            self.model.model_json_schema() if self.model else (dict(schema) if schema else None)
        )
        if self.schema is not None and not self.model:
            jsonschema.Draft202012Validator.check_schema(self.schema)
        self.instructions = instructions
        self.timeout_s = timeout_s

    @classmethod
    def from_config(cls, config: Any) -> Analyzer:
        """From an `AnalysisConfig`."""
        schema: Mapping[str, Any] | type[BaseModel] | None = (
            load_model(config.model) if config.model else config.schema_
        )
        return cls(
            summary=config.summary,
            success_question=config.success_question,
            schema=schema,
            instructions=config.instructions,
            timeout_s=config.timeout_s,
        )

    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the whole answer (the tool's parameters)."""
        props: dict[str, Any] = {}
        if self.summary:
            props["summary"] = {"type": "string", "description": "What happened in the call, 1-3 sentences."}
        if self.success_question:
            props["success"] = {"type": "boolean", "description": f"Yes or no: {self.success_question}"}
        if self.schema is not None:
            props["fields"] = {**self.schema, "description": "Values taken from the call (null if not said)."}
        return {
            "type": "object",
            "properties": props,
            "required": sorted(props),
            "additionalProperties": False,
        }

    def messages(self, record: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The request: the instructions, then the transcript and the tool results of the call."""
        tools = [
            {"tool": s.get("tool"), "arguments": s.get("arguments"), "result": s.get("reference")}
            for s in record.get("spans") or []
            if s.get("tool")
        ]
        asks = []
        if self.summary:
            asks.append("a short summary")
        if self.success_question:
            asks.append(f"whether this is true, yes or no: {self.success_question}")
        if self.schema is not None:
            asks.append("the fields of the schema, from what was said and what the tools returned")
        system = (
            "You analyse one finished phone call between an agent and a caller. "
            f"Call the tool {TOOL} exactly once with {', '.join(asks) or 'nothing'}. "
            "Use only what the transcript and the tool results say; [card], [phone] and the like are redacted "
            "values: leave them redacted. " + self.instructions
        ).strip()
        body = "Transcript:\n" + (as_text(record.get("turns") or []) or "(nothing was said)")
        if tools:
            body += "\n\nTool results:\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return [{"role": "system", "content": system}, {"role": "user", "content": body}]

    def tool(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": TOOL,
                "description": "Record the analysis.",
                "parameters": self.parameters(),
            },
        }

    def validate(self, answer: Any) -> dict[str, Any]:
        """The answer, checked (`AnalysisInvalid` says what is wrong); fields go through the pydantic model."""
        if not isinstance(answer, dict):
            raise AnalysisInvalid(f"the answer is not a JSON object: {answer!r:.200}")
        want = set(self.parameters()["properties"])
        missing, extra = sorted(want - set(answer)), sorted(set(answer) - want)
        if missing or extra:
            raise AnalysisInvalid(f"expected keys {sorted(want)}; missing {missing}, unexpected {extra}")
        out: dict[str, Any] = {}
        if self.summary:
            if not isinstance(answer["summary"], str) or not answer["summary"].strip():
                raise AnalysisInvalid("summary: a non-empty string is required")
            out["summary"] = answer["summary"].strip()
        if self.success_question:
            if not isinstance(answer["success"], bool):
                raise AnalysisInvalid(f"success: true or false is required, got {answer['success']!r}")
            out["success"] = answer["success"]
        if self.schema is not None:
            out["fields"] = self._fields(answer["fields"])
        return out

    def _fields(self, fields: Any) -> Any:
        if self.model is not None:
            try:
                return self.model.model_validate(fields).model_dump(mode="json")
            except ValidationError as exc:
                raise AnalysisInvalid(f"fields: {exc.errors(include_url=False)}") from None
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(self.schema or {}).iter_errors(fields)
        )
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(top)"
            raise AnalysisInvalid(f"fields {where}: {error.message}")
        return fields

    @staticmethod
    def _parse(reply: ChatReply) -> Any:
        for call in reply.tool_calls:
            if call.name == TOOL:
                try:
                    return json.loads(call.arguments_json or "null")
                except json.JSONDecodeError as exc:
                    raise AnalysisInvalid(f"the tool arguments are not JSON: {exc}") from None
        text = reply.content.strip().removeprefix("```json").removeprefix("```").removesuffix("```").strip()
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise AnalysisInvalid(
                f"no {TOOL} call and no JSON in the reply: {reply.content!r:.200}"
            ) from None

    async def run(self, llm: ChatModel, record: Mapping[str, Any]) -> dict[str, Any]:
        """Analyse one call's record: `{"summary"?, "success"?, "fields"?, "attempts", "ms"}` or, when both
        answers are invalid or the LLM fails, `{"error", "attempts", "ms"}` (and nothing else)."""
        t0 = time.perf_counter()
        messages = self.messages(record)
        error = ""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                reply = await asyncio.wait_for(llm.complete(messages, tools=[self.tool()]), self.timeout_s)
                result = self.validate(self._parse(reply))
            except (AnalysisInvalid, ChatModelError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}" if not isinstance(exc, AnalysisInvalid) else str(exc)
                log.warning("call %s: analysis attempt %d failed: %s", record.get("call_id"), attempt, error)
                if isinstance(exc, AnalysisInvalid):
                    messages = [
                        *messages,
                        {
                            "role": "user",
                            "content": f"That answer was invalid ({error}). Call {TOOL} again, "
                            "with every required key and values of the right types.",
                        },
                    ]
                continue
            return {**result, "attempts": attempt, "ms": round((time.perf_counter() - t0) * 1000, 1)}
        return {"error": error, "attempts": ATTEMPTS, "ms": round((time.perf_counter() - t0) * 1000, 1)}


__all__ = ["ATTEMPTS", "TOOL", "AnalysisInvalid", "Analyzer", "load_model"]
