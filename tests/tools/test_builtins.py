"""Built-in tools: time (fixed clock), calculator bounds, call control actions, weather and web search
against loopback HTTP servers that speak the Open-Meteo, DuckDuckGo and MediaWiki APIs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from aiohttp import web

from duetaspan.config import BuiltinToolsConfig
from duetaspan.errors import ConfigError
from duetaspan.registry import NO_INFO, CallContext, ToolFailed, ToolRegistry
from duetaspan.tools import BUILTIN_NAMES, builtin_tools, calculator
from duetaspan.tools.calculator import evaluate
from duetaspan.tools.clock import make_get_time, resolve_zone
from duetaspan.tools.search import first_sentence
from tests.support import serve_app

FIXED = datetime(2026, 3, 3, 7, 5, tzinfo=UTC)


async def test_get_time_surface_form_and_profile_fallback():
    reg = ToolRegistry([make_get_time(clock=lambda: FIXED)])
    r = await reg.call("get_time", {"place": "Tokyo"})
    assert r.reference == "(tool result) It is Tuesday, March 3, 2026 at 4:05 PM in Tokyo right now."
    assert r.data["timezone"] == "Asia/Tokyo" and r.data["iso"] == "2026-03-03T16:05:00+09:00"
    r = await reg.call("get_time", {}, CallContext(profile={"timezone": "America/Chicago"}))
    assert r.reference == "(tool result) It is Tuesday, March 3, 2026 at 1:05 AM in Chicago right now."
    r = await reg.call("get_time", {"place": "Atlantis"})
    assert not r.ok and "Atlantis" in r.error and r.reference == NO_INFO


@pytest.mark.parametrize(
    ("place", "zone"),
    [("new york", "America/New_York"), ("Lisbon", "Europe/Lisbon"), ("Europe/Berlin", "Europe/Berlin"),
     ("Portland, Oregon", "America/Los_Angeles"), ("PST", "America/Los_Angeles"), ("Seoul time", "Asia/Seoul"),
     ("UTC", "UTC")],
)  # fmt: skip
def test_city_names_to_zones(place: str, zone: str):
    assert resolve_zone(place)[0] == zone


def test_calculator_safe_and_bounded():
    assert evaluate("12 * (3 + 4)") == 84
    assert evaluate("0.15 * 80") == 12
    assert evaluate("2 ^ 10") == 1024 and evaluate("10 ÷ 4") == 2.5 and evaluate("1,000 + 1") == 1001
    assert evaluate("sqrt(16) + factorial(5)") == 124
    assert evaluate("-(2**3)") == -8
    for bad, message in [
        ("9 ** 9 ** 9", "exponents are limited"),
        ("10 ** 5000", "exponents are limited"),
        ("1 / 0", "division by zero"),
        ("__import__('os').system('true')", "unsupported expression"),
        ("().__class__", "unsupported expression"),
        ("a + 1", "unsupported expression"),
        ("factorial(100000)", "factorial needs"),
        ("1e308 * 10", "not a finite number"),
        ("2 +", "not an arithmetic expression"),
        ("1+" * 200 + "1", "too long"),
    ]:
        with pytest.raises(ToolFailed, match=message):
            evaluate(bad)


def test_calculator_functions_take_their_arguments():
    """Every function it advertises works with its real argument list (commas there are not separators)."""
    assert evaluate("round(2.567, 2)") == 2.57 and evaluate("round(2.5)") == 2
    assert evaluate("max(3, 7)") == 7 and evaluate("max(3,7)") == 7 and evaluate("min(4, 9, 2)") == 2
    assert evaluate("log(8, 2)") == 3 and evaluate("log(100, 10)") == 2
    assert evaluate("12,345,678 * 2") == 24_691_356 and evaluate("(1,000 + 1) * 2") == 2002
    assert evaluate("round(1,000 / 3, 1)".replace("1,000", "1000")) == 333.3
    for bad, message in [
        ("min(1,000, 5)", "ambiguous comma"),  # one thousand, or one and zero? never guessed
        ("max()", "takes 1 to"),
        ("sqrt(4, 5)", "takes 1 argument"),
        ("round(2.5, 2.5)", "round's digits"),
        ("log(8, 1)", "division by zero"),
        ("2,5", "unsupported expression"),
    ]:
        with pytest.raises(ToolFailed, match=message):
            evaluate(bad)


@pytest.mark.parametrize("name", sorted(calculator._FUNCTIONS))
def test_calculator_size_guards_hold_for_every_argument(name: str):
    """A huge or extreme value in any argument position gives a result or ToolFailed, never another error."""
    low, high = calculator._ARITY.get(name, (1, 1))
    extremes = ["2 ** 4000", "-(2 ** 4000)", "1e308", "-1e308", "0", "10 ** 300", "-(10 ** 300)"]
    for position in range(high or 3):
        for extreme in extremes:
            args = ["2"] * max(low, position + 1)
            args[position] = extreme
            try:
                value = evaluate(f"{name}({', '.join(args)})")
            except ToolFailed:
                continue
            assert isinstance(value, (int, float)) and (not isinstance(value, int) or value.bit_length() <= 4096)


async def test_calculate_reference():
    r = await ToolRegistry(builtin_tools(names=["calculate"])).call("calculate", {"expression": "15 * 4"})
    assert r.reference == "(tool result) 15 * 4 = 60." and r.data["value"] == 60


async def test_end_call_and_transfer_call_record_actions():
    seen = []
    ctx = CallContext(call_id="CA1", on_action=seen.append)
    settings = BuiltinToolsConfig(transfer_targets={"Billing": "+15550002222"})
    reg = ToolRegistry(builtin_tools(settings, names=["end_call", "transfer_call"]))
    assert all(s.side_effect for s in reg.specs())
    assert "Destinations: billing." in reg.get("transfer_call").spec.description
    r = await reg.call("transfer_call", {"destination": "billing", "reason": "refund"}, ctx)
    assert r.ok and r.reference == "(tool result) Transferring the call to billing now."
    r = await reg.call("transfer_call", {"destination": "+1 555 000 9999"}, ctx)
    assert not r.ok and "known destinations: billing" in r.error  # only named targets when configured
    r = await reg.call("end_call", {"reason": "caller said bye"}, ctx)
    assert r.ok
    assert [(a.kind, a.target, a.reason) for a in ctx.actions] == [
        ("transfer_call", "+15550002222", "refund"),
        ("end_call", None, "caller said bye"),
    ]
    assert seen == ctx.actions
    open_reg = ToolRegistry(builtin_tools(names=["transfer_call"]))
    ctx2 = CallContext()
    assert (await open_reg.call("transfer_call", {"destination": "+1 (555) 000-9999"}, ctx2)).ok
    assert ctx2.actions[0].target == "+15550009999"


def test_builtin_names_and_unknown():
    assert [t.name for t in builtin_tools()] == list(BUILTIN_NAMES)
    with pytest.raises(ConfigError, match=r"tools\.builtins: unknown built-in tools \['stocks'\]"):
        builtin_tools(names=["stocks"])


def weather_app(seen: list[dict]) -> web.Application:
    async def geocode(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        if request.query["name"] == "Nowhere":
            return web.json_response({"generationtime_ms": 0.1})
        return web.json_response({"results": [{"name": "Busan", "country": "South Korea",
                                               "latitude": 35.1, "longitude": 129.04}]})  # fmt: skip

    async def forecast(request: web.Request) -> web.Response:
        seen.append(dict(request.query))
        return web.json_response({"current": {"time": "2026-03-03T16:00", "temperature_2m": 26.1,
                                              "relative_humidity_2m": 68, "wind_speed_10m": 3.8,
                                              "weather_code": 0}})  # fmt: skip

    app = web.Application()
    app.router.add_get("/v1/search", geocode)
    app.router.add_get("/v1/forecast", forecast)
    return app


async def test_get_weather_against_loopback_open_meteo():
    seen: list[dict] = []
    async with serve_app(weather_app(seen)) as base:
        settings = BuiltinToolsConfig(geocoding_url=f"{base}/v1/search", forecast_url=f"{base}/v1/forecast")
        reg = ToolRegistry(builtin_tools(settings, names=["get_weather"]))
        r = await reg.call("get_weather", {"city": "Busan"})
        assert r.ok, r.error
        assert (
            r.reference == "(tool result) Busan, South Korea: 26.1°C, humidity 68%, wind 3.8 km/h, clear sky."
        )
        assert seen[0]["name"] == "Busan" and seen[1]["latitude"] == "35.1"
        assert "temperature_2m" in seen[1]["current"]
        r = await reg.call("get_weather", {}, CallContext(profile={"city": "Busan"}))  # the caller's own city
        assert r.ok and r.data["place"] == "Busan, South Korea"
        r = await reg.call("get_weather", {"city": "Nowhere"})
        assert not r.ok and "Nowhere" in r.error
        r = await reg.call("get_weather", {})
        assert not r.ok and "which city" in r.error
    # the service is gone now: a clear failure, not a crash
    r = await reg.call("get_weather", {"city": "Busan"})
    assert not r.ok and "unreachable" in r.error


def search_app(ddg: dict, wiki_extract: str | None) -> web.Application:
    async def duckduckgo(request: web.Request) -> web.Response:
        assert request.query["format"] == "json"
        return web.json_response(ddg, content_type="application/x-javascript")

    async def wikipedia(request: web.Request) -> web.Response:
        assert request.query["gsrsearch"]
        pages = {"1": {"title": "X", "extract": wiki_extract}} if wiki_extract else {}
        return web.json_response({"query": {"pages": pages}} if pages else {"batchcomplete": ""})

    app = web.Application()
    app.router.add_get("/ddg/", duckduckgo)
    app.router.add_get("/w/api.php", wikipedia)
    return app


@pytest.mark.parametrize(
    ("ddg", "wiki", "expected"),
    [
        ({"AbstractText": "Mount Everest is Earth's highest mountain. It is in the Himalayas."},
         "Everest is a mountain.", "(tool result) Mount Everest is Earth's highest mountain."),
        ({"AbstractText": "", "RelatedTopics": []},
         "Ada Lovelace (10 December 1815 – 27 November 1852) was an English mathematician. She wrote.",
         "(tool result) Ada Lovelace (10 December 1815 – 27 November 1852) was an English mathematician."),
        ({"Answer": "", "RelatedTopics": [{"Text": "Python - a programming language."}]}, None,
         "(tool result) Python - a programming language."),
    ],
)  # fmt: skip
async def test_web_search_against_loopback_services(ddg, wiki, expected):
    async with serve_app(search_app(ddg, wiki)) as base:
        settings = BuiltinToolsConfig(duckduckgo_url=f"{base}/ddg/", wikipedia_url=f"{base}/w/api.php")
        r = await ToolRegistry(builtin_tools(settings, names=["web_search"])).call(
            "web_search", {"query": "q"}
        )
    assert r.ok, r.error
    assert r.reference == expected


async def test_web_search_nothing_found_and_unreachable():
    async with serve_app(search_app({"AbstractText": ""}, None)) as base:
        settings = BuiltinToolsConfig(duckduckgo_url=f"{base}/ddg/", wikipedia_url=f"{base}/w/api.php")
        reg = ToolRegistry(builtin_tools(settings, names=["web_search"]))
        r = await reg.call("web_search", {"query": "zzqx"})
        assert not r.ok and "nothing found" in r.error and r.reference == NO_INFO
    r = await reg.call("web_search", {"query": "zzqx"})
    assert not r.ok and "unavailable" in r.error


def test_first_sentence():
    assert first_sentence("J. R. R. Tolkien was a writer. He wrote.") == "J. R. R. Tolkien was a writer."
    assert first_sentence("No end here") == "No end here"
    long = "word " * 200
    assert len(first_sentence(long)) <= 301
