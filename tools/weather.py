"""`get_weather`: current conditions from Open-Meteo (keyless): geocoding, then the forecast API.

Surface form (as in training, 13,856 spans):
`(tool result) Busan, South Korea: 26.1°C, humidity 68%, wind 3.8 km/h, clear sky.`
Base URLs are parameters so tests and self-hosted mirrors can stand in for the public service.

Example:
    >>> get_weather_tool = make_get_weather(geocoding_url="http://127.0.0.1:8081/v1/search",
    ...                                     forecast_url="http://127.0.0.1:8081/v1/forecast")
"""

from __future__ import annotations

from typing import Any

import aiohttp

from duetaspan.registry import CallContext, FunctionTool, ToolFailed, tool

GEOCODING_URL = "https://geocoding-api.open-meteo.com/v1/search"
FORECAST_URL = "https://api.open-meteo.com/v1/forecast"

# WMO weather interpretation codes, as Open-Meteo documents them.
WMO_CODES: dict[int, str] = {
    0: "clear sky", 1: "mainly clear", 2: "partly cloudy", 3: "overcast", 45: "fog", 48: "depositing rime fog",
    51: "light drizzle", 53: "moderate drizzle", 55: "dense drizzle", 56: "light freezing drizzle",
    57: "dense freezing drizzle", 61: "slight rain", 63: "moderate rain", 65: "heavy rain",
    66: "light freezing rain", 67: "heavy freezing rain", 71: "slight snow fall", 73: "moderate snow fall",
    75: "heavy snow fall", 77: "snow grains", 80: "slight rain showers", 81: "moderate rain showers",
    82: "violent rain showers", 85: "slight snow showers", 86: "heavy snow showers", 95: "thunderstorm",
    96: "thunderstorm with slight hail", 99: "thunderstorm with heavy hail",
}  # fmt: skip


async def _get_json(session: aiohttp.ClientSession, url: str, params: dict[str, Any]) -> Any:
    try:
        async with session.get(url, params=params) as response:
            if response.status != 200:
                raise ToolFailed(f"the weather service answered HTTP {response.status}")
            return await response.json(content_type=None)
    except aiohttp.ClientError as exc:
        raise ToolFailed(f"the weather service is unreachable ({type(exc).__name__})") from None


def render_weather(r: dict[str, Any]) -> str:
    """`Busan, South Korea: 26.1°C, humidity 68%, wind 3.8 km/h, clear sky.`"""
    parts = [f"{r['temperature_c']:.1f}°C"]
    if r.get("humidity_pct") is not None:
        parts.append(f"humidity {r['humidity_pct']:.0f}%")
    if r.get("wind_kmh") is not None:
        parts.append(f"wind {r['wind_kmh']:.1f} km/h")
    if r.get("conditions"):
        parts.append(r["conditions"])
    return f"{r['place']}: {', '.join(parts)}."


def make_get_weather(
    geocoding_url: str = GEOCODING_URL, forecast_url: str = FORECAST_URL, http_timeout_s: float = 4.0
) -> FunctionTool:
    """`get_weather` against the given Open-Meteo-compatible endpoints."""

    @tool(name="get_weather", render=render_weather)
    async def get_weather(
        city: str | None = None,
        latitude: float | None = None,
        longitude: float | None = None,
        ctx: CallContext | None = None,
    ) -> dict:
        """Get the current weather (temperature, humidity, wind, conditions) for a city.

        Args:
            city: city name, e.g. "Sydney" or "Paris, France"; omit for the caller's own city
            latitude: latitude, instead of a city
            longitude: longitude, instead of a city
        """
        profile = ctx.profile if ctx is not None else {}
        timeout = aiohttp.ClientTimeout(total=http_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if latitude is not None and longitude is not None and not city:
                place = f"{latitude:.2f}, {longitude:.2f}"
            else:
                city = city or profile.get("city")
                if not city:
                    raise ToolFailed("which city? no city was given and the caller's city is unknown")
                name = str(city).split(",")[0].strip()
                found = await _get_json(
                    session, geocoding_url, {"name": name, "count": 1, "language": "en", "format": "json"}
                )
                results = (found or {}).get("results") or []
                if not results:
                    raise ToolFailed(f"no place called {city!r} was found")
                hit = results[0]
                latitude, longitude = hit["latitude"], hit["longitude"]
                place = ", ".join(p for p in (hit.get("name"), hit.get("country")) if p)
            forecast = await _get_json(
                session,
                forecast_url,
                {
                    "latitude": latitude,
                    "longitude": longitude,
                    "current": "temperature_2m,relative_humidity_2m,wind_speed_10m,weather_code",
                    "wind_speed_unit": "kmh",
                    "timezone": "auto",
                },
            )
        current = (forecast or {}).get("current") or {}
        if current.get("temperature_2m") is None:
            raise ToolFailed("the weather service returned no current conditions")
        code = current.get("weather_code")
        return {
            "place": place,
            "latitude": latitude,
            "longitude": longitude,
            "temperature_c": float(current["temperature_2m"]),
            "humidity_pct": current.get("relative_humidity_2m"),
            "wind_kmh": current.get("wind_speed_10m"),
            "conditions": WMO_CODES.get(int(code)) if code is not None else None,
            "time": current.get("time"),
        }

    return get_weather


get_weather = make_get_weather()
