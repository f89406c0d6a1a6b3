"""The concierge end to end on CPU: its tools come only from MCP servers started as real child processes
(`duetaspan tools serve-mcp` for the built-in weather tool, the third-party `mcp-server-time`), the scripted
router picks them, and the answers land as Context Spans in the tiny-random model's streams."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from aiohttp import web

from duetaspan.config import AgentConfig
from duetaspan.pipeline.frames import SpanFrame
from duetaspan.pipeline.session import CallInfo
from examples.testing import LoopbackCaller, run_loopback_call, scripted_agent, tool_call
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import serve_app

HERE = Path(__file__).parent

LLM_SCRIPT = {
    "rules": [
        {"match": "tokyo", "reply": tool_call("get_current_time", timezone="Asia/Tokyo")},
        {"match": "weather", "reply": tool_call("get_weather", city="Sydney")},
    ]
}


def open_meteo(seen: list[str]) -> web.Application:
    """A loopback stand-in for Open-Meteo's geocoding and forecast APIs (tests never use the internet)."""

    async def geocode(request: web.Request) -> web.Response:
        seen.append(request.query["name"])
        return web.json_response({"results": [{"name": "Sydney", "country": "Australia",
                                               "latitude": -33.87, "longitude": 151.21}]})  # fmt: skip

    async def forecast(request: web.Request) -> web.Response:
        return web.json_response({"current": {"time": "2026-03-03T16:00", "temperature_2m": 24.5,
                                              "relative_humidity_2m": 60, "wind_speed_10m": 12.5,
                                              "weather_code": 1}})  # fmt: skip

    app = web.Application()
    app.router.add_get("/v1/search", geocode)
    app.router.add_get("/v1/forecast", forecast)
    return app


async def test_concierge_answers_from_mcp_tools(tmp_path, monkeypatch, tiny_engine):
    # the MCP servers are launched by name (`duetaspan`, `python`), as a user's shell would find them
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    seen: list[str] = []
    llm, asr = ScriptedLLMServer(LLM_SCRIPT), ScriptedASRServer()

    async def caller(c: LoopbackCaller) -> None:
        asr.default = "Hi, what's the weather like in Sydney right now?"
        await c.say("weather_sydney", seconds=1.0)
        await c.ask()
        asr.default = "And what time is it in Tokyo?"
        await c.say("time_tokyo", seconds=1.0)
        await c.ask()

    async with serve_app(open_meteo(seen)) as weather, llm.serve() as llm_url, asr.serve() as asr_url:
        # the example's own files, with the weather service pointed at the loopback stand-in
        tools_toml = tmp_path / "mcp_tools.toml"
        tools_toml.write_text(
            (HERE / "mcp_tools.toml").read_text()
            + f'geocoding_url = "{weather}/v1/search"\nforecast_url = "{weather}/v1/forecast"\n'
        )
        config = AgentConfig.load(HERE / "agent.toml")
        builtins_server = config.mcp_servers[0]
        assert builtins_server.args[-1] == "mcp_tools.toml" and builtins_server.cwd == HERE
        builtins_server.args[-1] = str(tools_toml)
        agent = scripted_agent(config, tiny_engine, llm_url, asr_url, tmp_path / "calls")
        async with agent:
            specs = {s.name: s for s in agent.registry.specs()}
            out = await run_loopback_call(agent, CallInfo("CA-concierge", caller="+15550002222"), caller)

    # every tool came over MCP; none is a Python tool; the denied one is absent
    assert {"get_weather", "web_search", "calculate", "get_current_time"} <= set(specs)
    assert {s.source for s in specs.values()} == {"mcp:builtins", "mcp:time"}
    assert "convert_time" not in specs
    weather, clock = out.outcomes
    assert isinstance(weather, SpanFrame) and weather.tool == "get_weather"
    assert weather.reference == (
        "(tool result) Sydney, Australia: 24.5°C, humidity 60%, wind 12.5 km/h, mainly clear."
    )
    assert seen == ["Sydney"]  # the MCP child process really called the (loopback) weather service
    assert isinstance(clock, SpanFrame) and clock.tool == "get_current_time"
    assert clock.arguments == {"timezone": "Asia/Tokyo"}
    assert clock.reference.startswith("(tool result) ") and "Asia/Tokyo" in clock.reference
    record = json.loads((tmp_path / "calls" / "CA-concierge.json").read_text())
    assert record["complete"] and [s["reference"] for s in record["spans"]] == [
        weather.reference,
        clock.reference,
    ]
    assert {"question", "router", "tool", "delivered"} <= {e.get("kind") for e in record["retrieval_events"]}
