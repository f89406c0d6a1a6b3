"""`get_time`: the local time anywhere, by city name or IANA zone, from `zoneinfo` (no network).

Surface form (as in training): `(tool result) It is Monday, March 3, 2026 at 4:05 PM in Tokyo right now.`

Example:
    >>> from datetime import datetime, UTC
    >>> t = make_get_time(clock=lambda: datetime(2026, 3, 3, 7, 5, tzinfo=UTC))
    >>> t("Tokyo")["sentence"]
    'It is Tuesday, March 3, 2026 at 4:05 PM in Tokyo right now.'
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from duetaspan.registry import CallContext, FunctionTool, ToolFailed, tool

# Common city and region names whose zone is not simply `Area/City_Name`.
CITY_ZONES: dict[str, str] = {
    "new york": "America/New_York", "nyc": "America/New_York", "boston": "America/New_York",
    "washington": "America/New_York", "miami": "America/New_York", "atlanta": "America/New_York",
    "philadelphia": "America/New_York", "toronto": "America/Toronto", "montreal": "America/Toronto",
    "chicago": "America/Chicago", "houston": "America/Chicago", "dallas": "America/Chicago",
    "austin": "America/Chicago", "denver": "America/Denver", "phoenix": "America/Phoenix",
    "los angeles": "America/Los_Angeles", "la": "America/Los_Angeles", "san francisco": "America/Los_Angeles",
    "seattle": "America/Los_Angeles", "san diego": "America/Los_Angeles", "las vegas": "America/Los_Angeles",
    "portland": "America/Los_Angeles", "vancouver": "America/Vancouver", "anchorage": "America/Anchorage",
    "honolulu": "Pacific/Honolulu", "hawaii": "Pacific/Honolulu", "mexico city": "America/Mexico_City",
    "sao paulo": "America/Sao_Paulo", "são paulo": "America/Sao_Paulo", "rio de janeiro": "America/Sao_Paulo",
    "buenos aires": "America/Argentina/Buenos_Aires", "lima": "America/Lima", "bogota": "America/Bogota",
    "santiago": "America/Santiago", "london": "Europe/London", "edinburgh": "Europe/London",
    "manchester": "Europe/London", "dublin": "Europe/Dublin", "paris": "Europe/Paris", "berlin": "Europe/Berlin",
    "munich": "Europe/Berlin", "frankfurt": "Europe/Berlin", "hamburg": "Europe/Berlin", "madrid": "Europe/Madrid",
    "barcelona": "Europe/Madrid", "rome": "Europe/Rome", "milan": "Europe/Rome", "amsterdam": "Europe/Amsterdam",
    "brussels": "Europe/Brussels", "zurich": "Europe/Zurich", "geneva": "Europe/Zurich", "vienna": "Europe/Vienna",
    "prague": "Europe/Prague", "warsaw": "Europe/Warsaw", "stockholm": "Europe/Stockholm", "oslo": "Europe/Oslo",
    "copenhagen": "Europe/Copenhagen", "helsinki": "Europe/Helsinki", "athens": "Europe/Athens",
    "istanbul": "Europe/Istanbul", "moscow": "Europe/Moscow", "kyiv": "Europe/Kyiv", "kiev": "Europe/Kyiv",
    "lisbon": "Europe/Lisbon", "cairo": "Africa/Cairo", "lagos": "Africa/Lagos", "nairobi": "Africa/Nairobi",
    "johannesburg": "Africa/Johannesburg", "cape town": "Africa/Johannesburg", "dubai": "Asia/Dubai",
    "abu dhabi": "Asia/Dubai", "riyadh": "Asia/Riyadh", "tel aviv": "Asia/Jerusalem", "jerusalem": "Asia/Jerusalem",
    "tehran": "Asia/Tehran", "karachi": "Asia/Karachi", "mumbai": "Asia/Kolkata", "delhi": "Asia/Kolkata",
    "new delhi": "Asia/Kolkata", "bangalore": "Asia/Kolkata", "bengaluru": "Asia/Kolkata", "kolkata": "Asia/Kolkata",
    "chennai": "Asia/Kolkata", "india": "Asia/Kolkata", "dhaka": "Asia/Dhaka", "bangkok": "Asia/Bangkok",
    "hanoi": "Asia/Bangkok", "ho chi minh city": "Asia/Ho_Chi_Minh", "singapore": "Asia/Singapore",
    "kuala lumpur": "Asia/Kuala_Lumpur", "jakarta": "Asia/Jakarta", "manila": "Asia/Manila",
    "hong kong": "Asia/Hong_Kong", "taipei": "Asia/Taipei", "beijing": "Asia/Shanghai", "shanghai": "Asia/Shanghai",
    "shenzhen": "Asia/Shanghai", "china": "Asia/Shanghai", "seoul": "Asia/Seoul", "busan": "Asia/Seoul",
    "korea": "Asia/Seoul", "south korea": "Asia/Seoul", "tokyo": "Asia/Tokyo", "osaka": "Asia/Tokyo",
    "kyoto": "Asia/Tokyo", "japan": "Asia/Tokyo", "sydney": "Australia/Sydney", "melbourne": "Australia/Melbourne",
    "brisbane": "Australia/Brisbane", "perth": "Australia/Perth", "adelaide": "Australia/Adelaide",
    "auckland": "Pacific/Auckland", "wellington": "Pacific/Auckland", "new zealand": "Pacific/Auckland",
    "utc": "UTC", "gmt": "UTC", "eastern": "America/New_York", "est": "America/New_York", "edt": "America/New_York",
    "central": "America/Chicago", "cst": "America/Chicago", "mountain": "America/Denver", "mst": "America/Denver",
    "pacific": "America/Los_Angeles", "pst": "America/Los_Angeles", "pdt": "America/Los_Angeles",
    "cet": "Europe/Paris", "bst": "Europe/London", "jst": "Asia/Tokyo", "kst": "Asia/Seoul",
}  # fmt: skip


@lru_cache(maxsize=1)
def _zones_by_city() -> dict[str, str]:
    """`lisbon` -> `Europe/Lisbon` for every IANA zone (the last path part, underscores as spaces)."""
    out: dict[str, str] = {}
    for zone in sorted(available_timezones()):
        if "/" in zone and not zone.startswith(("Etc/", "SystemV/", "posix/", "right/")):
            out.setdefault(zone.rsplit("/", 1)[1].replace("_", " ").lower(), zone)
    return out


def resolve_zone(place: str) -> tuple[str, str]:
    """(IANA zone, spoken label) for a city, region, abbreviation or zone name; `ToolFailed` if unknown."""
    text = " ".join(place.strip().split())
    key = text.lower().removesuffix(" time").strip(" .,")
    if "/" in text or text.upper() == "UTC":
        try:
            ZoneInfo(text)
        except (ZoneInfoNotFoundError, ValueError):
            pass
        else:
            return text, text.rsplit("/", 1)[-1].replace("_", " ") if "/" in text else text
    zone = CITY_ZONES.get(key) or _zones_by_city().get(key)
    if zone is None and "," in key:  # "Portland, Oregon" -> "portland"
        return resolve_zone(key.split(",", 1)[0])
    if zone is None:
        raise ToolFailed(f"I don't know the time zone of {text!r}; try a nearby big city")
    return zone, text.title() if text.islower() else text


def _hour(now: datetime) -> str:
    return f"{now.hour % 12 or 12}:{now.minute:02d} {'AM' if now.hour < 12 else 'PM'}"


def make_get_time(
    default_timezone: str | None = None, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
) -> FunctionTool:
    """`get_time` with a fallback zone (when neither the caller nor the profile names a place) and a clock."""

    @tool(name="get_time", render=lambda r: r["sentence"])
    def get_time(place: str | None = None, ctx: CallContext | None = None) -> dict:
        """Get the current local date and time in a city or time zone.

        Args:
            place: city, country or IANA time zone, e.g. "Tokyo" or "America/Chicago"; omit for the caller's own
                time zone
        """
        profile = ctx.profile if ctx is not None else {}
        target = place or profile.get("timezone") or profile.get("city") or default_timezone or "UTC"
        zone, label = resolve_zone(str(target))
        now = clock().astimezone(ZoneInfo(zone))
        sentence = f"It is {now:%A}, {now:%B} {now.day}, {now.year} at {_hour(now)} in {label} right now."
        return {
            "place": label,
            "timezone": zone,
            "iso": now.isoformat(timespec="seconds"),
            "time": _hour(now),
            "date": f"{now:%A}, {now:%B} {now.day}, {now.year}",
            "sentence": sentence,
        }

    return get_time


get_time = make_get_time()
