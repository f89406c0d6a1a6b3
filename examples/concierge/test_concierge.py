"""The concierge end to end on CPU: its tools come only from MCP servers started as real child processes
(`duetaspan tools serve-mcp` for the built-in weather tool, the third-party `mcp-server-time`), the scripted
router picks them, and the answers land as Context Spans in the tiny-random model's streams."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from aiohttp import web

from duetaspan.agent import Agent
from duetaspan.config import AgentConfig
from duetaspan.testing import scripted_call, serve_app, tool_call

HERE = Path(__file__).parent


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


async def test_concierge_answers_from_mcp_tools(
    tmp_path, monkeypatch, tiny_engine, scripted_llm, scripted_asr
):
    # the MCP servers are launched by name (`duetaspan`, `python`), as a user's shell would find them
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    seen: list[str] = []
    scripted_llm.on("tokyo", tool_call("get_current_time", timezone="Asia/Tokyo"))
    scripted_llm.on("weather", tool_call("get_weather", city="Sydney"))
    async with serve_app(open_meteo(seen)) as weather:
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
        agent = Agent.from_config(
            config, engine=tiny_engine, max_calls=1, seed=0, record_dir=tmp_path / "calls"
        )
        async with scripted_call(agent, "+15550002222", llm=scripted_llm, asr=scripted_asr,
                                 call_id="CA-concierge") as call:  # fmt: skip
            specs = {s.name: s for s in agent.registry.specs()}
            await call.say("weather_sydney", seconds=1.0)  # the ASR hears the phrase's words
            weather = await call.ask()
            await call.say("time_tokyo", heard="And what time is it in Tokyo?", seconds=1.0)
            clock = await call.ask()

    # every tool came over MCP; none is a Python tool; the denied one is absent
    assert {"get_weather", "web_search", "calculate", "get_current_time"} <= set(specs)
    assert {s.source for s in specs.values()} == {"mcp:builtins", "mcp:time"}
    assert "convert_time" not in specs
    assert weather.question == "Hi, what's the weather like in Sydney right now?"
    weather.expect_tool("get_weather", city="Sydney")
    assert weather.reference == (
        "(tool result) Sydney, Australia: 24.5°C, humidity 60%, wind 12.5 km/h, mainly clear."
    )
    assert seen == ["Sydney"]  # the MCP child process really called the (loopback) weather service
    clock.expect_tool("get_current_time", timezone="Asia/Tokyo").expect_span(contains="Asia/Tokyo")
    assert clock.reference.startswith("(tool result) ")
    record = json.loads((tmp_path / "calls" / "CA-concierge.json").read_text())
    assert record["complete"] and [s["reference"] for s in record["spans"]] == [
        weather.reference,
        clock.reference,
    ]
    assert {"question", "router", "tool", "delivered"} <= {e.get("kind") for e in record["retrieval_events"]}
