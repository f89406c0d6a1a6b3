"""Words for the side-effect policy: tokens and Snowball stems, spoken numbers, times and dates, the verbs
that ask for an action, and the meaning of identifier-like values (`min_bedrooms` is "minimum bedrooms").

Everything here is deterministic and English; `duetaspan.router.policy` decides with it.

Example:
    >>> sorted(numbers_in("fifteen hundred, or 1,650 dollars, for two"))
    [2.0, 15.0, 1500.0, 1650.0]
    >>> stems("Pets are allowed")
    ['pet', 'are', 'allow']
    >>> identifier_words("min_bedrooms")
    ['minimum', 'bedrooms']
"""

from __future__ import annotations

import re
from functools import lru_cache

import snowballstemmer  # type: ignore[import-untyped]

_STEMMER = snowballstemmer.stemmer("english")

# Spelling variants and abbreviations, read as the full word before stemming.
VARIANTS = {
    "licence": "license",
    "licences": "licenses",
    "min": "minimum",
    "max": "maximum",
    "num": "number",
    "qty": "quantity",
    "doc": "document",
    "docs": "documents",
    "dl": "driver license",
    "id": "identification",
    "acct": "account",
    "st": "street",
    "ave": "avenue",
    "rd": "road",
    "autopay": "autopay",
    "auto-pay": "autopay",
    "cc": "credit card",
    "appt": "appointment",
    "dept": "department",
    "pw": "password",
}

# Words of an option value -> other words a caller uses for it (each is compared by stem).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "minimum": ("least", "minimum", "more", "fewer"),
    "maximum": (
        "most",
        "under",
        "below",
        "less",
        "cap",
        "limit",
        "ceiling",
        "budget",
        "up",
        "over",
        "than",
        "above",
    ),
    "price": (
        "price",
        "cost",
        "rent",
        "budget",
        "dollars",
        "bucks",
        "afford",
        "pricey",
        "expensive",
        "cheap",
        "range",
    ),
    "pets": ("pet", "dog", "dogs", "cat", "cats", "puppy", "kitten"),
    "allowed": (
        "allow",
        "allowed",
        "friendly",
        "ok",
        "okay",
        "welcome",
        "permit",
        "accept",
        "have",
        "has",
        "take",
        "fine",
        "can",
    ),
    "bedrooms": ("bedroom", "bedrooms", "room", "rooms", "br"),
    "credit": ("card", "credit", "visa", "mastercard", "amex"),
    "card": ("card", "credit"),
    "electricity": ("electric", "power", "electricity", "energy"),
    "phone": ("phone", "cell", "mobile", "wireless"),
    "internet": ("internet", "wifi", "broadband"),
    "car": ("car", "auto", "vehicle"),
    "loan": ("loan", "note", "payment"),
    "driver": ("driver", "driving", "drivers", "license"),
    "license": ("license", "licence", "licensed"),
    "national": ("national", "id", "identity", "identification"),
    "identification": ("id", "identification", "identity"),
    "in": ("in", "inside", "own"),
    "unit": ("unit", "apartment", "suite"),
}

NUMBER_WORDS: dict[str, int] = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
}
NUMBER_WORDS.update({"oh": 0, "a": 1, "an": 1, "single": 1, "couple": 2, "pair": 2, "dozen": 12})
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80}
TENS["ninety"] = 90
SCALES = {"hundred": 100, "thousand": 1000, "grand": 1000, "k": 1000, "million": 1_000_000}
ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "thirteenth": 13, "fourteenth": 14,
    "fifteenth": 15, "sixteenth": 16, "seventeenth": 17, "eighteenth": 18, "nineteenth": 19,
    "twentieth": 20, "thirtieth": 30,
}  # fmt: skip
DATE_WORDS = frozenset(
    """today tonight tomorrow yesterday monday tuesday wednesday thursday friday saturday sunday weekend week
    weekday month january february march april may june july august september october november december jan
    feb mar apr jun jul aug sep sept oct nov dec next this""".split()
)


def words(text: str) -> list[str]:
    """Lowercase word tokens; `1,650` is one number, `$300` is `300`, possessive `'s` is dropped."""
    text = text.lower().replace("’", "'").replace("‘", "'")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = re.sub(r"(\d)(k)\b", r"\1 \2", text)
    tokens = re.findall(r"[a-z0-9]+(?:'[a-z]+)?(?:\.\d+)?", text)
    return [
        t[:-2] if t.endswith("'s") and t not in ("let's", "it's", "that's", "what's") else t for t in tokens
    ]


@lru_cache(maxsize=4096)
def stem(word: str) -> str:
    word = VARIANTS.get(word, word)
    return " ".join(_STEMMER.stemWord(w) for w in word.split())


def stems(text: str) -> list[str]:
    """The Snowball stems of `words(text)` (abbreviations expanded: `min` -> `minimum`)."""
    out: list[str] = []
    for w in words(text):
        out.extend(stem(w).split())
    return out


def identifier_words(value: str) -> list[str]:
    """The words of an identifier-like value: `min_bedrooms`, `pets-allowed`, `creditCard`, `in_unit`."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", value)
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if p]
    out: list[str] = []
    for p in parts:
        out.extend(VARIANTS.get(p, p).split())
    return out


def _groups(tokens: list[str]) -> list[tuple[list[str], int]]:
    """Runs of number words read as ordinary numbers: "two thousand five hundred", "forty five", "a hundred
    and twenty". A word that cannot continue the number ("sixteen | fifty") starts the next run."""
    runs: list[tuple[list[str], int]] = []
    i = 0
    while i < len(tokens):
        total, current, last, j = 0, 0, "", i
        seen: list[str] = []
        while j < len(tokens):
            t = tokens[j]
            if t in ("a", "an") and not seen and j + 1 < len(tokens) and tokens[j + 1] in SCALES:
                current, last = 1, "unit"
            elif t in NUMBER_WORDS and t not in ("a", "an") and last in ("", "tens", "scale"):
                if NUMBER_WORDS[t] >= 10 and last == "tens":
                    break
                current += NUMBER_WORDS[t]
                last = "unit" if NUMBER_WORDS[t] < 10 else "teen"
            elif t in TENS and last in ("", "scale"):
                current, last = current + TENS[t], "tens"
            elif t in SCALES and (last in ("unit", "teen", "tens") or (last == "" and t == "hundred")):
                current = max(current, 1) * SCALES[t]
                if SCALES[t] >= 1000:
                    total, current = total + current, 0
                last = "scale"
            elif t.isdigit() and not seen and j + 1 < len(tokens) and tokens[j + 1] in SCALES:
                current, last = int(t), "unit"
            elif (
                t == "and"
                and last == "scale"
                and j + 1 < len(tokens)
                and tokens[j + 1] in NUMBER_WORDS | TENS
            ):
                j += 1
                continue
            else:
                break
            seen.append(t)
            j += 1
        if seen:
            runs.append((seen, total + current))
            i = j
        else:
            runs.append(([], -1))
            i += 1
    return runs


def _spoken_numbers(tokens: list[str]) -> set[float]:
    """Numbers said in words; two runs side by side are also read as one number said in parts, as prices
    and times are ("sixteen fifty" is 1650 and 16.50, "forty five fifty" is 45.50)."""
    found: set[float] = set()
    runs = _groups(tokens)
    for n, (seen, value) in enumerate(runs):
        if not seen:
            continue
        found.add(float(value))
        found.update(float(NUMBER_WORDS.get(t, TENS.get(t, -1))) for t in seen if t not in ("a", "an"))
        if n + 1 < len(runs) and runs[n + 1][0] and 0 < runs[n + 1][1] < 100 and value < 100:
            following = runs[n + 1][1]
            found.add(float(value * 100 + following))
            found.add(value + following / 100)
    found.discard(-1.0)
    return found


def numbers_in(text: str) -> set[float]:
    """Every number in `text`, in digits or in words (ordinals too: "the ninth" is 9)."""
    tokens = words(text)
    found: set[float] = set()
    for t in tokens:
        if re.fullmatch(r"\d+(\.\d+)?", t):
            found.add(float(t))
        elif t in ORDINALS:
            found.add(float(ORDINALS[t]))
        else:
            m = re.fullmatch(r"(\d+)(st|nd|rd|th|am|pm|ish)", t)
            if m:
                found.add(float(m.group(1)))
    found |= _spoken_numbers(tokens)
    return found


def compact(text: str) -> str:
    """Letters and digits only, number words as digits: "X four four seven" -> "x447" (spoken ids)."""
    out = []
    text = re.sub(
        r"\b([a-z]) (?:as in|for) [a-z]+(?:-[a-z]+)?\b", r"\1", text.lower()
    )  # "S as in Sam", "X as in x-ray"
    for w in words(text):
        if w in NUMBER_WORDS and w not in ("a", "an", "single", "couple", "pair", "dozen"):
            out.append(str(NUMBER_WORDS[w]))
        else:
            out.append(w.replace("'", ""))
    return "".join(out)


_TIME = re.compile(r"^\s*(\d{1,2})(?::(\d{2}))?(?::\d{2})?\s*([ap]\.?m\.?)?\s*$", re.I)
_DATE = re.compile(r"^\s*(\d{4})-(\d{2})-(\d{2})(?:[T ].*)?$")


def parse_time(value: str) -> tuple[int, int] | None:
    """`(hour, minute)` of a clock time ("19:00", "7:30 pm", "7pm"), or None."""
    m = _TIME.match(value)
    if not m or (m.group(2) is None and m.group(3) is None):
        return None
    hour, minute = int(m.group(1)), int(m.group(2) or 0)
    if m.group(3) and m.group(3).lower().startswith("p") and hour < 12:
        hour += 12
    return (hour, minute) if hour < 24 and minute < 60 else None


def parse_date(value: str) -> int | None:
    """The day of the month of an ISO date ("2026-12-05"), or None."""
    m = _DATE.match(value)
    return int(m.group(3)) if m else None
