"""PII redaction on a corpus of our own: recall per kind, and false redactions of ordinary numbers.

Usage:
    python benchmarks/redaction.py                 # the default corpus (seed 7, 200 sentences per kind)
    python benchmarks/redaction.py --per-kind 1000 --seed 3 --json redaction.json

The corpus is generated here, deterministically from `--seed`, from sentence templates a caller or an agent
would say on the phone: card numbers (valid Luhn, 15 or 16 digits, written in groups, run together or read
aloud digit by digit), US SSNs (written with dashes or spaces, or read aloud), US and UK phone numbers in
their usual written forms (and US ones read aloud), e-mail addresses, and account or order numbers read aloud
or written (`digits`). Beside them, sentences of ordinary numbers that must stay: times, prices,
quantities, dates, years, addresses, percentages, flight numbers.

Printed: per kind, how many PII values were fully redacted (recall) and how many got the right label; for
the ordinary sentences, how many were changed at all (false redactions) and which, up to `--show`.
Redaction runs with every kind on (`["card", "ssn", "phone", "email", "digits"]`).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from duetaspan.webhooks.redact import KINDS, Redactor, luhn_ok

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def spoken(digits: str, rng: random.Random) -> str:
    """Read aloud digit by digit, sometimes with "oh" for 0, "double 5" for 55, and commas between groups."""
    words: list[str] = []
    i = 0
    while i < len(digits):
        word = "oh" if digits[i] == "0" and rng.random() < 0.3 else WORDS[int(digits[i])]
        if i + 1 < len(digits) and digits[i + 1] == digits[i] and rng.random() < 0.5:
            words.append(f"double {word}")
            i += 2
        else:
            words.append(word)
            i += 1
        if rng.random() < 0.15 and i < len(digits):
            words[-1] += ","
    return " ".join(words)


def card_number(rng: random.Random) -> str:
    prefix, length = rng.choice([("4", 16), ("51", 16), ("37", 15), ("6011", 16)])
    body = prefix + "".join(str(rng.randrange(10)) for _ in range(length - len(prefix) - 1))
    return next(body + str(c) for c in range(10) if luhn_ok(body + str(c)))


def card_text(rng: random.Random) -> str:
    n = card_number(rng)
    style = rng.randrange(3)
    if style == 0:
        return " ".join(n[i : i + 4] for i in range(0, len(n), 4))
    if style == 1:
        return n
    return spoken(n, rng)


def ssn_text(rng: random.Random) -> str:
    area = rng.choice([rng.randrange(1, 666), rng.randrange(667, 900)])
    s = f"{area:03d}{rng.randrange(1, 100):02d}{rng.randrange(1, 10000):04d}"
    style = rng.randrange(3)
    if style == 0:
        return f"{s[:3]}-{s[3:5]}-{s[5:]}"
    if style == 1:
        return f"{s[:3]} {s[3:5]} {s[5:]}"
    return spoken(s, rng)


US_AREAS = ["212", "415", "312", "617", "206", "303", "512", "404", "702", "646"]


def phone_text(rng: random.Random) -> str:
    area, ex, line = rng.choice(US_AREAS), f"{rng.randrange(200, 1000):03d}", f"{rng.randrange(10000):04d}"
    style = rng.randrange(6)
    if style == 0:
        return f"({area}) {ex}-{line}"
    if style == 1:
        return f"{area}-{ex}-{line}"
    if style == 2:
        return f"+1 {area} {ex} {line}"
    if style == 3:
        return f"+44 20 7946 {rng.randrange(10000):04d}"
    if style == 4:
        return f"{area}.{ex}.{line}"
    return spoken(area + ex + line, rng)


def email_text(rng: random.Random) -> str:
    user = rng.choice(["ann", "j.smith", "bob_lee", "maria.garcia", "k.nguyen+orders", "dr.who"])
    domain = rng.choice(["example.com", "mail.example.org", "clinic.co.uk", "acme.io"])
    return f"{user}{rng.randrange(100) if rng.random() < 0.5 else ''}@{domain}"


def digits_text(rng: random.Random) -> str:
    n = "".join(str(rng.randrange(10)) for _ in range(rng.randrange(6, 11)))
    return spoken(n, rng) if rng.random() < 0.6 else n


TEMPLATES = {
    "card": ["my card number is {}", "it's {} expiring next year", "sure, {}", "the visa is {} thanks"],
    "ssn": ["my social is {}", "social security number {}", "it's {}, I think"],
    "phone": ["call me back at {}", "my number is {} please", "you can reach me on {} after five"],
    "email": ["my email is {}", "send it to {} please", "it's {}"],
    "digits": ["my account number is {}", "the order number is {}", "member id {} okay"],
}
MAKERS = {"card": card_text, "ssn": ssn_text, "phone": phone_text, "email": email_text, "digits": digits_text}

ORDINARY = [
    "can I book a table for {q} at {h}:{m:02d} pm",
    "it costs ${p}.{c:02d} plus tax",
    "the total is {big:,} dollars",
    "we need {q} rooms for {q2} nights from March {d}",
    "I was born in {y}",
    "we're at {a} Main Street, suite {s}",
    "about {pct} percent of it",
    "the flight UA {f} leaves at {h} {ampm}",
    "my appointment is on the {d}th at {h} o'clock",
    "order two large pizzas and {q} sodas",
    "it takes one or two days, maybe three",
    "we open at nine and close at five",
    "the meeting is from {h}:{m:02d} to {h2}:{m:02d}",
    "I'd like {q} tickets at ${p} each for {y}",
    "between {q} and {q2} people, say twenty five",
]


def ordinary(rng: random.Random) -> str:
    return rng.choice(ORDINARY).format(
        q=rng.randrange(1, 13), q2=rng.randrange(1, 13), h=rng.randrange(1, 13), h2=rng.randrange(1, 13),
        m=rng.choice([0, 15, 30, 45]), p=rng.randrange(1, 500), c=rng.randrange(100),
        big=rng.randrange(1000, 99999), d=rng.randrange(1, 29), y=rng.randrange(1950, 2031),
        a=rng.randrange(1, 9999), s=rng.randrange(100, 999), pct=rng.randrange(1, 100),
        f=rng.randrange(100, 9999), ampm=rng.choice(["am", "pm"]),
    )  # fmt: skip


def corpus(per_kind: int, seed: int) -> tuple[list[dict[str, Any]], list[str]]:
    rng = random.Random(seed)
    items = []
    for kind in KINDS:
        for _ in range(per_kind):
            value = MAKERS[kind](rng)
            template = rng.choice(TEMPLATES[kind])
            text = template.format(value)
            items.append({"kind": kind, "value": value, "text": text, "at": template.index("{}")})
    return items, [ordinary(rng) for _ in range(per_kind * 2)]


def run(per_kind: int, seed: int, show: int) -> dict[str, Any]:
    items, plain = corpus(per_kind, seed)
    redactor = Redactor(KINDS)
    figures: dict[str, Any] = {"per_kind": per_kind, "seed": seed, "kinds": {}}
    t0 = time.perf_counter()
    misses: list[str] = []
    for kind in KINDS:
        mine = [i for i in items if i["kind"] == kind]
        hit = right = 0
        for item in mine:
            start, end = item["at"], item["at"] + len(item["value"])
            covering = [m for m in redactor.find(item["text"]) if m.start <= start and m.end >= end]
            if covering:
                hit += 1
                right += covering[0].kind == kind
            elif len(misses) < show:
                misses.append(f"{kind}: {item['text']!r} -> {redactor.redact(item['text'])!r}")
        figures["kinds"][kind] = {"n": len(mine), "recall": hit / len(mine), "right_label": right / len(mine)}
    changed = [(t, redactor.redact(t)) for t in plain if redactor.find(t)]
    figures["ordinary"] = {
        "n": len(plain),
        "false_redactions": len(changed),
        "rate": len(changed) / len(plain),
    }
    figures["ms_per_sentence"] = (time.perf_counter() - t0) * 1000 / (len(items) + len(plain))
    figures["examples_missed"] = misses
    figures["examples_false"] = [f"{a!r} -> {b!r}" for a, b in changed[:show]]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--per-kind", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--show", type=int, default=5, help="examples of misses and false redactions")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    figures = run(args.per_kind, args.seed, args.show)
    print(f"redaction corpus: {args.per_kind} sentences per kind, seed {args.seed}")
    for kind, f in figures["kinds"].items():
        print(f"  {kind:7s} recall {f['recall']:6.1%}  right label {f['right_label']:6.1%}  (n={f['n']})")
    o = figures["ordinary"]
    print(f"  ordinary numbers: {o['false_redactions']} of {o['n']} sentences changed ({o['rate']:.1%})")
    print(f"  {figures['ms_per_sentence']:.3f} ms per sentence")
    for line in figures["examples_missed"]:
        print("  missed:", line)
    for line in figures["examples_false"]:
        print("  false:", line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
