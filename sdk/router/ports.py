"""The ports the router calls through: speech-to-text and chat completions, with their error bases.

The router owns these small protocols; adapters implement them (`duetaspan.adapters.asr` raises
`TranscriptionError` subclasses, `duetaspan.adapters.llm.ChatClient` is a `ChatModel` raising
`ChatModelError` subclasses), so dependencies point from the adapters to the router, never back.

Example:
    >>> class Canned:                      # a Transcriber that always hears the same question
    ...     async def transcribe(self, pcm, sample_rate: int) -> str:
    ...         return "what time is it"
    >>> isinstance(Canned(), Transcriber)
    True
    >>> ChatReply("It is noon.").tool_calls
    []
    >>> heard = Transcript("What time is it", [Word("What", 0.0, 0.3), Word("time", 0.3, 0.6)])
    >>> heard == "What time is it", heard.words[1].end, words_of("plain text")
    (True, 0.6, ())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from duetaspan.errors import DuetaspanError


class TranscriptionError(DuetaspanError):
    """Speech-to-text failed (backend down, HTTP error, malformed reply); the message names the backend."""


@dataclass(frozen=True)
class Word:
    """One recognised word and its time in seconds (from the start of the transcribed audio, or of the call's
    stream once the capture has placed it)."""

    word: str
    start: float
    end: float

    def shifted(self, offset: float) -> Word:
        return Word(self.word, round(self.start + offset, 3), round(self.end + offset, 3))

    def as_dict(self) -> dict[str, Any]:
        return {"word": self.word, "start": self.start, "end": self.end}


class Transcript(str):
    """A transcript with its word times: it IS the text (a `str`: every caller that wants a string keeps
    working), and `words` holds `Word`s where the recogniser gives them (empty otherwise)."""

    words: tuple[Word, ...]

    def __new__(cls, text: str = "", words: Any = ()) -> Transcript:
        obj = super().__new__(cls, text)
        obj.words = tuple(words)
        return obj

    @property
    def text(self) -> str:
        return str(self)


def words_of(text: Any, offset: float = 0.0) -> tuple[Word, ...]:
    """The word times a transcriber returned with `text` (a `Transcript`), moved by `offset` seconds; `()` for
    a plain string."""
    words = getattr(text, "words", ()) or ()
    return tuple(w.shifted(offset) for w in words) if offset else tuple(words)


@runtime_checkable
class Transcriber(Protocol):
    """Anything that turns mono float32 PCM into text. Implementations raise `TranscriptionError` on failure.
    One that knows word times returns a `Transcript` (a `str` with `words`)."""

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str: ...


class ChatModelError(DuetaspanError):
    """The chat model failed: connection refused, HTTP error, or a reply that is not a chat completion."""


@dataclass(frozen=True)
class ToolCallRequest:
    """One tool call as the server sent it; `arguments_json` is the raw (possibly invalid) JSON text."""

    name: str
    arguments_json: str
    id: str | None = None


@dataclass
class ChatReply:
    """The first choice of a chat completion, flattened."""

    content: str
    tool_calls: list[ToolCallRequest] = field(default_factory=list)
    finish_reason: str | None = None
    elapsed_ms: float = 0.0


class ChatModel(Protocol):
    """One chat-completions model; `complete` raises `ChatModelError` (or a subclass) on failure."""

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None
    ) -> ChatReply: ...

    async def aclose(self) -> None: ...


__all__ = [
    "ChatModel",
    "ChatModelError",
    "ChatReply",
    "ToolCallRequest",
    "Transcriber",
    "Transcript",
    "TranscriptionError",
    "Word",
    "words_of",
]
