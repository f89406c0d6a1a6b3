"""The per-call Context DB: the caller's profile, what they said, the tool turns, and a bounded summary.

Facts come only from explicit, well-formed statements ("my name is Ada", "I'm in Sydney" for a known city)
or from configuration; speech like "i'm feeling tired" never becomes a name. Tool outputs are kept as data
and rendered quoted (see `duetaspan.router.prompt`), never as instructions.

Example:
    >>> db = ContextDB(CallerProfile(caller_number="+15551234567"))
    >>> db.add_utterance("Hi, my name is Ada and I'm in Sydney.")
    >>> (db.profile.name, db.profile.city, db.profile.timezone)
    ('Ada', 'Sydney', 'Australia/Sydney')
    >>> db.add_utterance("i'm feeling tired")
    >>> db.profile.name
    'Ada'
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from duetaspan.registry import CallContext, Turn
from duetaspan.router.cities import lookup_city


@dataclass
class CallerProfile:
    """What is known about the caller. Empty fields are unknown."""

    name: str | None = None
    city: str | None = None
    timezone: str | None = None
    caller_number: str | None = None

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if v}


@dataclass
class ContextTurn:
    """One entry: a caller utterance or a tool turn (`name`, redacted `arguments`, `reference`)."""

    role: Literal["caller", "tool"]
    text: str
    t: float
    name: str | None = None
    arguments: dict[str, Any] | None = None


# Words that follow "my name is" / "call me" in speech but are not names.
_NOT_NAMES = frozenset(
    """a an the not no just really very so feeling going trying calling here there sorry fine good okay ok
    tired busy sick home back new your my is was what who why how when where because actually um uh like
    mister miss missus doctor""".split()
)
_NAME = re.compile(
    r"\b(?i:my name is|my name's|call me)\s+([A-Za-z][A-Za-z'\-]{1,24})(?=\s*(?:[.,!?;]|$|\band\b))"
)
_PLACE = re.compile(r"\b(?:i'm|i am|im)\s+(?:in|calling from|from)\s+([A-Za-z][A-Za-z .'\-]{1,40})", re.I)
_LIVE = re.compile(r"\bi live in\s+([A-Za-z][A-Za-z .'\-]{1,40})", re.I)


def extract_name(text: str) -> str | None:
    """The name in an explicit "my name is X" / "call me X" statement, else None."""
    for match in _NAME.finditer(text.replace("’", "'")):
        word = match.group(1).strip("'-")
        if word.lower() not in _NOT_NAMES and len(word) >= 2:
            return word[0].upper() + word[1:]
    return None


def extract_city(text: str) -> tuple[str, str] | None:
    """`(city, timezone)` from "I'm in X" / "I'm calling from X" / "I live in X" when X is a known city."""
    for pattern in (_PLACE, _LIVE):
        for match in pattern.finditer(text.replace("’", "'")):
            found = lookup_city(match.group(1))
            if found:
                return found
    return None


@dataclass
class ContextDB:
    """Per-call memory for the router. Create one per call; `ctx` (optional) is kept in sync so tools see
    the profile (`ctx.profile`) and the conversation (`ctx.transcript`)."""

    profile: CallerProfile = field(default_factory=CallerProfile)
    ctx: CallContext | None = None
    max_turns: int = 200
    turns: list[ContextTurn] = field(default_factory=list)
    agent_text: str = ""

    def __post_init__(self) -> None:
        if self.ctx is not None:
            if not self.profile.caller_number and self.ctx.caller:
                self.profile.caller_number = self.ctx.caller
            for key in ("name", "city", "timezone"):
                if getattr(self.profile, key) is None and isinstance(self.ctx.profile.get(key), str):
                    setattr(self.profile, key, self.ctx.profile[key])
            self._sync()

    def _sync(self) -> None:
        if self.ctx is not None:
            self.ctx.profile.update(self.profile.as_dict())

    def _append(self, turn: ContextTurn) -> None:
        self.turns.append(turn)
        if len(self.turns) > self.max_turns:
            del self.turns[: len(self.turns) - self.max_turns]

    def add_utterance(self, text: str, t: float | None = None) -> None:
        """Record a final caller utterance and learn explicit facts from it (repeats are ignored)."""
        text = " ".join(text.split())
        if not text:
            return
        last = next((x for x in reversed(self.turns) if x.role == "caller"), None)
        if last is not None and last.text.lower() == text.lower():
            return
        stamp = time.monotonic() if t is None else t
        self._append(ContextTurn("caller", text, stamp))
        if self.ctx is not None:
            self.ctx.transcript.append(Turn("user", text, stamp))
        name = extract_name(text)
        if name:
            self.profile.name = name
        place = extract_city(text)
        if place:
            self.profile.city, self.profile.timezone = place
        self._sync()

    def add_tool_turn(
        self, name: str, arguments: dict[str, Any], reference: str, t: float | None = None
    ) -> None:
        """Record a tool call (arguments already redacted) and the reference it produced."""
        stamp = time.monotonic() if t is None else t
        self._append(ContextTurn("tool", reference, stamp, name=name, arguments=dict(arguments)))
        if self.ctx is not None:
            self.ctx.transcript.append(Turn("tool", f"{name}: {reference}", stamp))

    def add_agent_text(self, text: str, max_chars: int = 2000) -> None:
        """Append what the agent said (decoded text stream); only the tail is kept."""
        self.agent_text = (self.agent_text + text)[-max_chars:]

    def caller_utterances(self) -> list[str]:
        return [t.text for t in self.turns if t.role == "caller"]

    def tool_turns(self) -> list[ContextTurn]:
        return [t for t in self.turns if t.role == "tool"]

    def recent(self, max_turns: int = 10, max_chars: int = 1400) -> list[ContextTurn]:
        """The newest turns that fit in `max_turns` and about `max_chars` of text, oldest first."""
        out: list[ContextTurn] = []
        used = 0
        for turn in reversed(self.turns):
            size = len(turn.text) + 40
            if len(out) >= max_turns or (out and used + size > max_chars):
                break
            out.append(turn)
            used += size
        return list(reversed(out))
