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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from duetaspan.errors import DuetaspanError


class TranscriptionError(DuetaspanError):
    """Speech-to-text failed (backend down, HTTP error, malformed reply); the message names the backend."""


@runtime_checkable
class Transcriber(Protocol):
    """Anything that turns mono float32 PCM into text. Implementations raise `TranscriptionError` on failure."""

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


__all__ = ["ChatModel", "ChatModelError", "ChatReply", "ToolCallRequest", "Transcriber", "TranscriptionError"]
