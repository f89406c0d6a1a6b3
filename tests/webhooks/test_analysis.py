"""End-of-call analysis against the scripted LLM of `duetaspan.testing` over real HTTP (the router's
`ChatClient`): a valid answer saved whole; an invalid one retried once with the error; two invalid answers (or
a dead LLM) recorded as an error and nothing else; a pydantic model or a JSON Schema from TOML."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from duetaspan.adapters.llm import ChatClient
from duetaspan.config import AgentConfig
from duetaspan.testing import ScriptedLLM
from duetaspan.testing.llm import content, error, tool_call
from duetaspan.webhooks.analysis import TOOL, Analyzer

RECORD = {
    "call_id": "CA1",
    "turns": [
        {"who": "agent", "text": "Harbor Bistro, how can I help?", "start": 0.0, "end": 1.6},
        {"who": "caller", "text": "a table for four at seven please", "start": 2.0, "end": 3.5},
        {"who": "agent", "text": "Booked, four people at 7 PM.", "start": 4.1, "end": 5.9},
    ],
    "spans": [
        {"tool": "book_table", "arguments": {"people": 4, "time": "19:00"}, "reference": "booked B-17"}
    ],
}
SCHEMA = {
    "type": "object",
    "properties": {"people": {"type": "integer", "minimum": 1}, "time": {"type": "string"}},
    "required": ["people", "time"],
    "additionalProperties": False,
}


class Booking(BaseModel):
    people: int
    time: str


def analyzer(schema=SCHEMA) -> Analyzer:
    return Analyzer(summary=True, success_question="Did the caller book a table?", schema=schema)


GOOD = {"summary": "The caller booked a table for four at 7 PM.", "success": True,
        "fields": {"people": 4, "time": "19:00"}}  # fmt: skip


async def _run(script, a: Analyzer | None = None):
    llm = ScriptedLLM({"steps": script})
    async with llm as base_url:
        client = ChatClient(base_url, "scripted", api_key="x")
        try:
            result = await (a or analyzer()).run(client, RECORD)
        finally:
            await client.aclose()
    return result, llm


async def test_a_valid_answer_is_saved_whole_and_the_request_carries_the_call():
    result, llm = await _run([tool_call(TOOL, **GOOD)])
    assert {k: result[k] for k in ("summary", "success", "fields")} == GOOD and result["attempts"] == 1
    [request] = llm.requests
    assert [t["function"]["name"] for t in request["tools"]] == [TOOL]
    params = request["tools"][0]["function"]["parameters"]
    assert (
        params["required"] == ["fields", "success", "summary"] and params["properties"]["fields"]["required"]
    )
    text = request["messages"][-1]["content"]
    assert "caller: a table for four at seven please" in text and "booked B-17" in text


async def test_an_invalid_answer_is_retried_once_with_the_error():
    bad = {**GOOD, "fields": {"people": "four", "time": "19:00"}}
    result, llm = await _run([tool_call(TOOL, **bad), tool_call(TOOL, **GOOD)])
    assert result["fields"] == GOOD["fields"] and result["attempts"] == 2
    retry = llm.requests[1]["messages"][-1]["content"]
    assert "invalid" in retry and "people" in retry


@pytest.mark.parametrize(
    "script",
    [
        [tool_call(TOOL, summary="ok", success="yes", fields={"people": 4, "time": "7"})]
        * 2,  # success not bool
        [tool_call(TOOL, summary="ok", success=True)] * 2,  # fields missing
        [content("Sure! The call went well."), content("{not json")],  # no tool call, no JSON
        [error(500), error(503)],  # the LLM is down
    ],
)
async def test_twice_invalid_is_an_error_and_never_half_saved(script):
    result, llm = await _run(script)
    assert set(result) == {"error", "attempts", "ms"} and result["attempts"] == 2 and result["error"]
    assert len(llm.requests) == 2


async def test_json_in_text_and_a_pydantic_model():
    result, _ = await _run([content("```json\n" + json.dumps(GOOD) + "\n```")], analyzer(Booking))
    assert result["fields"] == {"people": 4, "time": "19:00"}
    result, _ = await _run([tool_call(TOOL, **{**GOOD, "fields": {"people": 4}})] * 2, analyzer(Booking))
    assert "time" in result["error"]


def test_from_toml_schema_and_model_path():
    cfg = AgentConfig.from_toml(
        '[analysis]\nenabled = true\nsuccess_question = "Booked?"\n'
        '[analysis.schema]\ntype = "object"\nrequired = ["people"]\n[analysis.schema.properties.people]\n'
        'type = "integer"\n'
    )
    a = Analyzer.from_config(cfg.analysis)
    assert a.validate({"summary": "s", "success": False, "fields": {"people": 2}})["fields"] == {"people": 2}
    cfg = AgentConfig.from_toml(f'[analysis]\nmodel = "{__name__}:Booking"\nsummary = false\n')
    a = Analyzer.from_config(cfg.analysis)
    assert a.model is Booking and sorted(a.parameters()["properties"]) == ["fields"]
