"""Several tool calls in one router reply, over real HTTP against the scripted OpenAI-compatible server: the
native replies are shaped as OpenAI-compatible servers send them (several `tool_calls`, each with an id,
arguments as a JSON string, `content: null`); JSON mode reads `{"calls": [...]}` and objects one per line."""

from __future__ import annotations

import json

import pytest

from duetaspan.adapters.llm import ChatClient
from duetaspan.config import RetrievalConfig
from duetaspan.registry import CallContext, ToolRegistry, tool
from duetaspan.router import ContextDB, RetrievalManager, Router
from duetaspan.router.outcome import call_key, combine_references
from tests.fakes.llm_server import ScriptedLLMServer
from tests.router.tools import make_registry


def calls(*pairs: tuple[str, dict]) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments} for name, arguments in pairs]}


def counting_registry() -> tuple[ToolRegistry, list[str]]:
    registry = make_registry()
    ran: list[str] = []
    registry.on_result.append(lambda result: ran.append(result.name))
    return registry, ran


async def route(script, question, *, mode="native", registry=None, db=None, **kwargs):
    server = ScriptedLLMServer(script)
    steps = []
    async with server.serve() as url:
        router = Router(
            registry or make_registry(), ChatClient(url, "fake", api_key="k"), mode=mode, **kwargs
        )
        result = await router.route(question, db=db, on_step=steps.append)
        await router.aclose()
    return result, server.requests, steps


async def test_native_reply_with_two_tool_calls_runs_both_in_order():
    registry, ran = counting_registry()
    script = {"steps": [calls(("get_weather", {"city": "Lisbon"}), ("track_order", {"order_id": "Q-7781"}))]}
    result, requests, steps = await route(
        script, "weather in lisbon and track order Q-7781", registry=registry
    )
    assert ran == ["get_weather", "track_order"]
    assert [c.tool for c in result.calls] == ["get_weather", "track_order"]
    assert [c.decision for c in result.calls] == ["tool", "tool"]
    assert result.decision == "tool" and result.attempts == 1 and len(requests) == 1
    # both results in one span, one prefix; the first call under the old single-call names
    assert result.reference == (
        "(tool result) Lisbon: 21°C, clear sky. shipping status: Out for delivery, order: Q-7781."
    )
    assert result.tool == "get_weather" and result.arguments == {"city": "Lisbon"}
    assert result.tool_result is not None and result.tool_result.name == "get_weather"
    assert [s.tool for s in steps if s.kind == "tool"] == ["get_weather", "track_order"]
    # the prompt no longer asks for at most one tool, and the reply has room for several calls
    system = requests[0]["messages"][0]["content"]
    assert "at most ONE tool" not in system and "one call per part" in system
    assert requests[0]["max_tokens"] == 512


async def test_the_fake_server_sends_real_shaped_parallel_calls():
    server = ScriptedLLMServer({"steps": [calls(("get_time", {"timezone": "UTC"}), ("end_call", {}))]})
    async with server.serve() as url:
        reply = await ChatClient(url, "fake", api_key="k").complete([{"role": "user", "content": "x"}])
    assert reply.content == "" and [c.name for c in reply.tool_calls] == ["get_time", "end_call"]
    assert all(c.id and c.id.startswith("call_") for c in reply.tool_calls)
    assert json.loads(reply.tool_calls[0].arguments_json) == {"timezone": "UTC"}


@pytest.mark.parametrize(
    "content",
    [
        '{"calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "get_time", "arguments": {"timezone": "Europe/Oslo"}}]}',
        '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        '{"name": "get_time", "arguments": {"timezone": "Europe/Oslo"}}\n```',
        '[{"tool": "get_weather", "args": {"city": "Oslo"}}, {"tool": "get_time", "args": '
        '{"timezone": "Europe/Oslo"}}]',
    ],
)
async def test_json_mode_reply_with_several_calls_runs_them_all(content):
    result, requests, _ = await route(
        {"steps": [{"content": content}]}, "weather and time in oslo", mode="json"
    )
    assert [c.tool for c in result.ran] == ["get_weather", "get_time"]
    assert result.reference == "(tool result) Oslo: 21°C, clear sky. It is 9:05 PM in Europe/Oslo right now."
    system = requests[0]["messages"][0]["content"]
    assert '{"calls": [' in system and "ONE tool" not in system


async def test_side_effect_policy_applies_to_each_call():
    ctx = CallContext()
    db = ContextDB(ctx=ctx)
    script = {
        "steps": [
            calls(
                ("track_order", {"order_id": "Q-7781"}),
                ("book_flight", {"passenger_name": "John Smith", "flight_id": "FL1"}),
                ("end_call", {}),
            )
        ]
    }
    registry, ran = counting_registry()
    result, _, _ = await route(script, "where is my order Q-7781", registry=registry, db=db)
    assert ran == ["track_order"] and ctx.actions == []
    assert [c.decision for c in result.calls] == ["tool", "refused", "refused"]
    assert result.calls[1].arguments["passenger_name"] == "[redacted]"
    assert result.decision == "tool" and "Q-7781" in result.reference and "book_flight" in result.detail
    # nothing ran: the reply is refused as a whole
    result, _, _ = await route({"steps": [calls(("end_call", {}), ("end_call", {}))]}, "what about sunday")
    assert result.decision == "refused" and result.reference is None and result.ran == []


async def test_an_invalid_call_is_repaired_before_any_call_of_the_reply_runs():
    registry, ran = counting_registry()
    script = {
        "steps": [
            calls(("track_order", {"order_id": "Q-1"}), ("get_weather", {"town": "Rome"})),
            calls(("track_order", {"order_id": "Q-1"}), ("get_weather", {"city": "Rome"})),
        ]
    }
    result, requests, _ = await route(script, "track Q-1 and the weather in rome", registry=registry)
    assert ran == ["track_order", "get_weather"] and result.attempts == 2
    repair = requests[1]["messages"][-1]["content"]
    assert "get_weather" in repair and "city" in repair and "all of them" in repair
    echoed = json.loads(requests[1]["messages"][-2]["content"])
    assert [c["name"] for c in echoed["calls"]] == ["track_order", "get_weather"]
    # a broken JSON argument string in the second call is reported with its tool
    broken = {
        "tool_calls": [
            {"name": "get_time", "arguments": {"timezone": "UTC"}},
            {"name": "get_weather", "arguments": "{city: Rome"},
        ]
    }
    result, requests, _ = await route({"steps": [broken, broken]}, "x", registry=registry)
    assert result.decision == "invalid" and "get_weather" in result.detail and len(requests) == 2


async def test_the_same_call_twice_in_one_reply_runs_once_and_skip_keys_are_not_run():
    registry, ran = counting_registry()
    twice = calls(("get_weather", {"city": "Rome"}), ("get_weather", {"city": "Rome"}))
    result, _, _ = await route({"steps": [twice]}, "weather in rome", registry=registry)
    assert ran == ["get_weather"] and [c.decision for c in result.calls] == ["tool", "repeat"]
    # skip keys are on the real arguments: the redacted passenger names differ, so only Ada's is a repeat
    server = ScriptedLLMServer(
        {
            "steps": [
                calls(
                    ("book_flight", {"passenger_name": "Ada Lovelace", "flight_id": "FL1"}),
                    ("book_flight", {"passenger_name": "Bob Stone", "flight_id": "FL1"}),
                )
            ]
        }
    )
    made = {call_key("book_flight", {"passenger_name": "Ada Lovelace", "flight_id": "FL1"})}
    async with server.serve() as url:
        router = Router(registry, ChatClient(url, "fake", api_key="k"))
        result = await router.route("book FL1 for ada lovelace and bob stone", skip=made)
        await router.aclose()
    assert [c.decision for c in result.calls] == ["repeat", "tool"]
    assert [c.arguments["passenger_name"] for c in result.calls] == ["[redacted]", "[redacted]"]
    assert ran == ["get_weather", "book_flight"] and result.tool == "book_flight"


@tool
def long_report(topic: str) -> str:
    """A long report.

    Args:
        topic: what about
    """
    return f"{topic}: " + " ".join(f"detail{i}" for i in range(80)) + " END"


async def test_all_results_share_the_span_cap():
    registry = ToolRegistry([long_report, *make_registry()])
    script = {
        "steps": [
            calls(
                ("long_report", {"topic": "alpha"}),
                ("get_weather", {"city": "Rome"}),
                ("long_report", {"topic": "beta"}),
            )
        ]
    }
    result, _, _ = await route(script, "reports please", registry=registry, max_reference_chars=200)
    assert len(result.reference) <= 200 and result.reference.startswith("(tool result) alpha: detail0")
    assert "Rome: 21°C, clear sky." in result.reference and "beta: detail0" in result.reference
    assert combine_references(["(tool result) a.", None, "(no information found)"], 100) == (
        "(tool result) a. (no information found)"
    )
    assert combine_references(["(no information found)", "(no information found)"], 100) == (
        "(no information found)"
    )


async def test_retrieval_manager_records_every_call_of_the_reply():
    server = ScriptedLLMServer(
        {"steps": [calls(("get_weather", {"city": "Lisbon"}), ("track_order", {"order_id": "Q-7781"}))]}
    )
    delivered, events = [], []
    db = ContextDB(ctx=CallContext(call_id="CA1"))
    async with server.serve() as url:
        router = Router(make_registry(), ChatClient(url, "fake", api_key="k"))
        manager = RetrievalManager(
            router=router,
            deliver=lambda reference, meta: delivered.append((reference, meta)),
            on_event=events.append,
            db=db,
            config=RetrievalConfig(),
        )
        manager.on_ret(10, 1.0, question="weather in lisbon and track order Q-7781")
        await manager.wait()
        await router.aclose()
    ((reference, meta),) = delivered
    assert "Lisbon" in reference and "Q-7781" in reference and meta.source == "tool:get_weather"
    assert [t.name for t in db.tool_turns()] == ["get_weather", "track_order"]
    assert [e.tool for e in events if e.kind == "tool"] == ["get_weather", "track_order"]


async def test_a_later_ret_never_runs_the_same_side_effect_again_in_the_call():
    book = calls(("book_flight", {"passenger_name": "Ada Lovelace", "flight_id": "FL1"}))
    server = ScriptedLLMServer({"default": book})
    events = []
    registry, ran = counting_registry()
    async with server.serve() as url:
        router = Router(registry, ChatClient(url, "fake", api_key="k"))
        manager = RetrievalManager(
            router=router,
            deliver=lambda reference, meta: None,
            on_event=events.append,
            config=RetrievalConfig(),
        )
        for frame in (10, 20):
            manager.on_ret(frame, question="book flight FL1 for ada lovelace")
            await manager.wait()
        await router.aclose()
    assert ran == ["book_flight"] and len(server.requests) == 2
    assert [e.reason for e in events if e.kind == "no_span"] == ["repeat: already made"]


async def test_the_calls_span_carries_the_first_calls_tool_and_arguments():
    from duetaspan.pipeline.retrieval import RouterRetrieval

    server = ScriptedLLMServer(
        {"steps": [calls(("get_weather", {"city": "Lisbon"}), ("track_order", {"order_id": "Q-7781"}))]}
    )
    delivered: list = []
    async with server.serve() as url:
        router = Router(make_registry(), ChatClient(url, "fake", api_key="k"))
        retrieval = RouterRetrieval(
            router, None, lambda ref, meta: delivered.append((ref, meta)), lambda e: None
        )
        retrieval.manager.on_ret(10, 1.0, question="weather in lisbon and track order Q-7781")
        await retrieval.manager.wait()
        await retrieval.close()
        await router.aclose()
    ((reference, meta),) = delivered
    assert "Lisbon" in reference and "Q-7781" in reference
    assert meta["tool"] == "get_weather" and meta["arguments"] == {"city": "Lisbon"}


async def test_a_reply_with_too_many_calls_runs_the_first_eight_and_says_so(caplog):
    registry, ran = counting_registry()
    many = calls(*(("get_weather", {"city": f"City{i}"}) for i in range(10)))
    with caplog.at_level("WARNING", logger="duetaspan.router.router"):
        result, _, _ = await route({"steps": [many]}, "weather everywhere", registry=registry)
    assert len(ran) == 8 and len(result.calls) == 8
    assert "10 tool calls; only the first 8 run" in caplog.text
