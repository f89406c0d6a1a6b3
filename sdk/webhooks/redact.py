"""PII redaction (`[privacy] redact`): card numbers (Luhn-checked), US SSNs, phone numbers (`phonenumbers`),
e-mail addresses, and digit strings, written or read aloud ("four one one one ..."), replaced by `[card]`,
`[ssn]`, `[phone]`, `[email]`, `[digits]` in everything the SDK stores or sends.

What is redacted is what people *said* (transcripts, utterances, questions, references, tool arguments in
the record); the call's own numbers (`meta.caller` / `meta.called`, needed for the index, the do-not-call
list and `records delete --number`) are kept. Tools are never given redacted text: they run during the call
on the router's real values; redaction applies where things are written (the record, traces, logs,
webhooks, the viewer).

Ordinary numbers stay: times ("7:30", "10 pm"), prices ("$12.99", "1,299"), quantities ("4 people"), years
("2026"). A written digit run counts as `digits` from 6 digits on; a spoken one from 4 single-digit words
on ("one two three four"); `benchmarks/redaction.py` measures both sides on its corpus.

Example:
    >>> r = Redactor(["card", "email", "digits"])
    >>> r.redact("card 4111 1111 1111 1111, mail ann@example.com, at 7:30 for $12.99")
    'card [card], mail [email], at 7:30 for $12.99'
    >>> r.redact("it is four one one one one one one one one one one one one one one one")
    'it is [card]'
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import phonenumbers

Kind = Literal["card", "ssn", "phone", "email", "digits"]
KINDS: tuple[Kind, ...] = ("card", "ssn", "phone", "email", "digits")

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# a run of digits joined by single spaces or dashes (card numbers are read and written in groups)
_DIGIT_RUN = re.compile(r"(?<![\w.,$:/])\d(?:[ -]?\d){3,}(?![\w$%]|[.,:/]\d)")
_SSN = re.compile(r"(?<![\w-])(\d{3})[- ](\d{2})[- ](\d{4})(?![\w-])")
_SPOKEN = {
    "zero": "0", "oh": "0", "o": "0", "one": "1", "two": "2", "three": "3", "four": "4", "five": "5",
    "six": "6", "seven": "7", "eight": "8", "nine": "9",
}  # fmt: skip
_REPEAT = {"double": 2, "triple": 3}  # "five double one" is 511
_WORD = re.compile(r"[A-Za-z]+")
MIN_WRITTEN_DIGITS = 6
MIN_SPOKEN_DIGITS = 4


@dataclass(frozen=True)
class Match:
    """One redacted stretch of a text: `text[start:end]` is replaced by `[kind]`."""

    start: int
    end: int
    kind: Kind


def luhn_ok(digits: str) -> bool:
    """Whether a digit string passes the Luhn check (card numbers do; a random one 1 time in 10)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch)
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _ssn_ok(area: str, group: str, serial: str) -> bool:
    return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"


class Redactor:
    """Finds and replaces the configured kinds of personal data in text (and in nested JSON values)."""

    def __init__(self, kinds: Iterable[str], *, region: str = "US") -> None:
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"[privacy] redact: unknown kinds {unknown} (known: {list(KINDS)})")
        self.kinds: frozenset[str] = frozenset(kinds)
        self.region = region

    def __bool__(self) -> bool:
        return bool(self.kinds)

    def _classify(self, digits: str) -> Kind | None:
        """What a run of digits is, among the enabled kinds (None: leave it)."""
        if "card" in self.kinds and 13 <= len(digits) <= 19 and luhn_ok(digits):
            return "card"
        if "ssn" in self.kinds and len(digits) == 9 and _ssn_ok(digits[:3], digits[3:5], digits[5:]):
            return "ssn"
        if "phone" in self.kinds and len(digits) in (10, 11) and self._is_phone(digits):
            return "phone"
        return None

    def _is_phone(self, digits: str) -> bool:
        try:
            number = phonenumbers.parse(digits, self.region)
        except phonenumbers.NumberParseException:
            return False
        return phonenumbers.is_valid_number(number)

    def find(self, text: str) -> list[Match]:
        """The stretches to redact, in order, not overlapping."""
        if not self.kinds or not text:
            return []
        found: list[Match] = []

        def free(start: int, end: int) -> bool:
            return all(end <= m.start or start >= m.end for m in found)

        if "email" in self.kinds:
            found += [Match(m.start(), m.end(), "email") for m in _EMAIL.finditer(text)]
        if "ssn" in self.kinds:
            for m in _SSN.finditer(text):
                if _ssn_ok(*m.groups()) and free(m.start(), m.end()):
                    found.append(Match(m.start(), m.end(), "ssn"))
        if "phone" in self.kinds:
            for pm in phonenumbers.PhoneNumberMatcher(
                text, self.region, leniency=phonenumbers.Leniency.VALID
            ):
                if free(pm.start, pm.end):
                    found.append(Match(pm.start, pm.end, "phone"))
        for m in _DIGIT_RUN.finditer(text):
            digits = re.sub(r"\D", "", m.group())
            kind = self._classify(digits)
            if kind is None and "digits" in self.kinds and len(digits) >= MIN_WRITTEN_DIGITS:
                kind = "digits"
            if kind is not None and free(m.start(), m.end()):
                found.append(Match(m.start(), m.end(), kind))
        found += [m for m in self._spoken(text) if free(m.start, m.end)]
        return sorted(found, key=lambda m: m.start)

    def _spoken(self, text: str) -> list[Match]:
        """Digit strings read aloud: runs of digit words ("four one one one", "five five five oh one")."""
        out: list[Match] = []
        run: list[re.Match[str]] = []

        def flush() -> None:
            while run and run[-1].group().lower() in _REPEAT:  # "... double" with nothing after it
                run.pop()
            digits, times = "", 1
            for w in run:
                word = w.group().lower()
                if word in _REPEAT:
                    times = _REPEAT[word]
                    continue
                digits, times = digits + _SPOKEN[word] * times, 1
            if not run:
                return
            if len(digits) >= MIN_SPOKEN_DIGITS and any(w.group().lower() not in ("o", "oh") for w in run):
                kind = self._classify(digits) or ("digits" if "digits" in self.kinds else None)
                if kind is not None:
                    out.append(Match(run[0].start(), run[-1].end(), kind))
            run.clear()

        prev_end = 0
        for w in _WORD.finditer(text):
            gap = text[prev_end : w.start()]
            is_digit = w.group().lower() in _SPOKEN or w.group().lower() in _REPEAT
            if run and (not is_digit or not re.fullmatch(r"[\s,.-]*", gap)):
                flush()
            if is_digit:
                run.append(w)
            prev_end = w.end()
        if run:
            flush()
        return out

    def redact(self, text: str) -> str:
        """`text` with every match replaced by `[kind]`."""
        matches = self.find(text)
        if not matches:
            return text
        parts: list[str] = []
        at = 0
        for m in matches:
            parts += [text[at : m.start], f"[{m.kind}]"]
            at = m.end
        parts.append(text[at:])
        return "".join(parts)

    def redact_value(self, value: Any, *, keep: frozenset[str] = frozenset()) -> Any:
        """Redact every string inside a JSON-like value; dict keys in `keep` are left as they are."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: v if k in keep else self.redact_value(v, keep=keep) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.redact_value(v, keep=keep) for v in value]
        return value

    def redact_pieces(self, pieces: list[str]) -> list[str]:
        """Redact text that arrives in pieces (the agent's per-frame tokens): the joined text is searched, and
        each piece overlapping a match is blanked, the first of them carrying `[kind]` (its leading space
        kept), so the pieces still join to the redacted text."""
        joined = "".join(pieces)
        matches = self.find(joined)
        if not matches:
            return list(pieces)
        out = list(pieces)
        at = 0
        labelled: set[int] = set()
        for i, piece in enumerate(pieces):
            start, end = at, at + len(piece)
            at = end
            for n, m in enumerate(matches):
                if start < m.end and end > m.start:
                    lead = piece[: max(0, m.start - start)] if n not in labelled else ""
                    out[i] = (lead + f"[{m.kind}]") if n not in labelled else ""
                    if n not in labelled and lead == "" and piece[:1].isspace():
                        out[i] = piece[: len(piece) - len(piece.lstrip())] + f"[{m.kind}]"
                    labelled.add(n)
                    break
        return out


class _RedactingFactory:
    """A log-record factory: the previous factory's record, its message, a logged exception's traceback text
    and its stack text redacted (while `active`)."""

    def __init__(self, previous: Callable[..., logging.LogRecord], redactor: Redactor) -> None:
        self.previous, self.redactor, self.active = previous, redactor, True

    def __call__(self, *args: Any, **kwargs: Any) -> logging.LogRecord:
        record = self.previous(*args, **kwargs)
        if not self.active:
            return record
        self._redact_traceback(record)
        try:
            message = record.getMessage()
        except Exception:  # a malformed format string: let the handler report it as usual
            return record
        redacted = self.redactor.redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        return record

    def _redact_traceback(self, record: logging.LogRecord) -> None:
        """`log.exception(...)`: the traceback formatted once and redacted into `exc_text`, `exc_info` cleared
        (handlers print `exc_text` when `exc_info` is empty; none can format the raw exception again)."""
        exc = record.exc_info  # a new record: exc_text is not formatted yet
        if isinstance(exc, tuple) and exc[0] is not None:
            record.exc_text = self.redactor.redact(logging.Formatter().formatException(exc))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = self.redactor.redact(record.stack_info)


class RedactingLogRecords:
    """Installs a log-record factory whose messages are redacted (every logger, every handler, also those
    added later); `uninstall()` (or `close()`) takes it out again.

    Installed by `serve` (`duetaspan.webhooks.served`) and by `Agent.start` (an agent used from Python, the
    testing harness): when a factory already installed redacts every kind this one would (`serve` and its
    agent), nothing is added. Taken out while another factory was installed over it, it stays in the chain
    and passes records through unchanged."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._factory: _RedactingFactory | None = None

    def install(self) -> None:
        if self._factory is not None or not self.redactor:
            return
        previous = logging.getLogRecordFactory()
        covering = previous.redactor if isinstance(previous, _RedactingFactory) and previous.active else None
        if covering is not None and self.redactor.kinds <= covering.kinds and covering.region == self.redactor.region:
            return  # already redacted by the one installed
        self._factory = _RedactingFactory(previous, self.redactor)
        logging.setLogRecordFactory(self._factory)

    @property
    def installed(self) -> bool:
        """Whether this hook put a factory in (False: nothing to redact, or one already covered it)."""
        return self._factory is not None

    def uninstall(self) -> None:
        factory, self._factory = self._factory, None
        if factory is None:
            return
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(factory.previous)
        else:  # another factory wraps ours: keep the chain, stop redacting
            factory.active = False

    close = uninstall  # `Agent.stop` closes what `Agent.shared` holds


__all__ = ["KINDS", "Kind", "Match", "RedactingLogRecords", "Redactor", "luhn_ok"]
