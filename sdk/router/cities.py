"""Known cities (lower-case name -> IANA timezone) that the Context DB accepts as the caller's location.

A closed list on purpose: "I'm in a meeting" must not make "a meeting" the caller's city.
"""

from __future__ import annotations

from types import MappingProxyType

KNOWN_CITIES = MappingProxyType(
    {
        "amsterdam": "Europe/Amsterdam", "athens": "Europe/Athens", "atlanta": "America/New_York",
        "auckland": "Pacific/Auckland", "austin": "America/Chicago", "bangkok": "Asia/Bangkok",
        "barcelona": "Europe/Madrid", "beijing": "Asia/Shanghai", "berlin": "Europe/Berlin",
        "bogota": "America/Bogota", "boston": "America/New_York", "brisbane": "Australia/Brisbane",
        "brussels": "Europe/Brussels", "budapest": "Europe/Budapest", "buenos aires": "America/Argentina/Buenos_Aires",
        "busan": "Asia/Seoul", "cairo": "Africa/Cairo", "calgary": "America/Edmonton",
        "cape town": "Africa/Johannesburg", "chicago": "America/Chicago", "copenhagen": "Europe/Copenhagen",
        "dallas": "America/Chicago", "delhi": "Asia/Kolkata", "denver": "America/Denver",
        "detroit": "America/Detroit", "dubai": "Asia/Dubai", "dublin": "Europe/Dublin",
        "edinburgh": "Europe/London", "frankfurt": "Europe/Berlin", "geneva": "Europe/Zurich",
        "hamburg": "Europe/Berlin", "helsinki": "Europe/Helsinki", "hong kong": "Asia/Hong_Kong",
        "honolulu": "Pacific/Honolulu", "houston": "America/Chicago", "istanbul": "Europe/Istanbul",
        "jakarta": "Asia/Jakarta", "johannesburg": "Africa/Johannesburg", "kyoto": "Asia/Tokyo",
        "lagos": "Africa/Lagos", "las vegas": "America/Los_Angeles", "lima": "America/Lima",
        "lisbon": "Europe/Lisbon", "london": "Europe/London", "los angeles": "America/Los_Angeles",
        "madrid": "Europe/Madrid", "manchester": "Europe/London", "manila": "Asia/Manila",
        "melbourne": "Australia/Melbourne", "mexico city": "America/Mexico_City", "miami": "America/New_York",
        "milan": "Europe/Rome", "montreal": "America/Toronto", "moscow": "Europe/Moscow",
        "mumbai": "Asia/Kolkata", "munich": "Europe/Berlin", "nairobi": "Africa/Nairobi",
        "new york": "America/New_York", "osaka": "Asia/Tokyo", "oslo": "Europe/Oslo",
        "ottawa": "America/Toronto", "paris": "Europe/Paris", "perth": "Australia/Perth",
        "philadelphia": "America/New_York", "phoenix": "America/Phoenix", "portland": "America/Los_Angeles",
        "prague": "Europe/Prague", "rio de janeiro": "America/Sao_Paulo", "rome": "Europe/Rome",
        "san diego": "America/Los_Angeles", "san francisco": "America/Los_Angeles", "santiago": "America/Santiago",
        "sao paulo": "America/Sao_Paulo", "seattle": "America/Los_Angeles", "seoul": "Asia/Seoul",
        "shanghai": "Asia/Shanghai", "singapore": "Asia/Singapore", "stockholm": "Europe/Stockholm",
        "sydney": "Australia/Sydney", "taipei": "Asia/Taipei", "tel aviv": "Asia/Jerusalem",
        "tokyo": "Asia/Tokyo", "toronto": "America/Toronto", "vancouver": "America/Vancouver",
        "vienna": "Europe/Vienna", "warsaw": "Europe/Warsaw", "washington": "America/New_York",
        "wellington": "Pacific/Auckland", "zurich": "Europe/Zurich",
    }
)  # fmt: skip


def lookup_city(text: str) -> tuple[str, str] | None:
    """`(display name, timezone)` when `text` starts with a known city name, else None.

    >>> lookup_city("new york right now")
    ('New York', 'America/New_York')
    >>> lookup_city("a meeting") is None
    True
    """
    low = " ".join(text.lower().replace(",", " ").replace(".", " ").split())
    best = None
    for name in KNOWN_CITIES:
        if (low == name or low.startswith(name + " ")) and (best is None or len(name) > len(best)):
            best = name
    if best is None:
        return None
    return best.title(), KNOWN_CITIES[best]
