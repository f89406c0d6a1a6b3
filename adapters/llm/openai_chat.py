"""A thin async client for any OpenAI-compatible `/v1/chat/completions` server (vLLM, Ollama, OpenAI...).

It owns transport concerns only: one request with a hard timeout, no hidden retries, errors mapped to
`LLMError`/`LLMTimeout`, and the reply flattened to text plus tool calls. Prompting and parsing live in
`duetaspan.router`, which owns the `ChatModel` protocol this client implements (`duetaspan.router.ports`,
with `ChatReply`, `ToolCallRequest` and the `ChatModelError` base of `LLMError`).

Example:
    >>> client = ChatClient(base_url="http://127.0.0.1:8004/v1", model="gemma", api_key="none")
    >>> # reply = await client.complete([{"role": "user", "content": "hi"}], tools=registry.openai_tools())
    >>> # reply.tool_calls[0].name, reply.tool_calls[0].arguments_json
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import openai

from duetaspan.errors import ConfigError
from duetaspan.router.ports import ChatModelError, ChatReply, ToolCallRequest


class LLMError(ChatModelError):
    """The chat server failed: connection refused, HTTP error, or a reply that is not a chat completion."""


class LLMTimeout(LLMError, TimeoutError):
    """The chat server did not answer within the timeout."""


class ChatClient:
    """Sends chat completions to one OpenAI-compatible server with one model.

    Args:
        base_url: the server's API root, e.g. `http://127.0.0.1:8004/v1` (a trailing `/v1` is added when
            missing, since every OpenAI-compatible server serves under it).
        model: the model name the server expects.
        api_key: the key; when None it is read from `api_key_env` (servers without auth accept any value).
        api_key_env: environment variable holding the key.
        timeout_s: hard limit for one request, connection included.
        temperature, max_tokens: sampling defaults for every request (512 tokens: room for several tool calls).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 8.0,
        temperature: float | None = 0.0,
        max_tokens: int | None = 512,
    ) -> None:
        if not base_url:
            raise ConfigError("router LLM: base_url is empty (e.g. http://127.0.0.1:8004/v1)")
        if not model:
            raise ConfigError("router LLM: model is empty")
        base_url = base_url.rstrip("/")
        if not base_url.endswith("/v1"):
            base_url += "/v1"
        key = api_key if api_key is not None else os.environ.get(api_key_env) or "none"
        self.model = model
        self.timeout_s = timeout_s
        self.temperature = temperature
        self.max_tokens = max_tokens
        # max_retries=0: a voice turn has a 2.5 s budget, a silent retry would only burn it.
        self._client = openai.AsyncOpenAI(base_url=base_url, api_key=key, timeout=timeout_s, max_retries=0)

    @classmethod
    def from_config(cls, config: Any) -> ChatClient:
        """A client for a `duetaspan.config.RouterConfig` (its endpoint, model, key, timeout and sampling)."""
        key = config.api_key() if hasattr(config, "api_key") else None
        return cls(
            config.base_url,
            config.model,
            api_key=key,
            timeout_s=config.timeout_s,
            temperature=config.temperature,
            max_tokens=config.max_tokens,
        )

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | None = None,
        json_object: bool = False,
        timeout_s: float | None = None,
    ) -> ChatReply:
        """One chat completion. Raises `LLMTimeout` after `timeout_s` (default: the client's) or `LLMError`."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        if self.max_tokens is not None:
            kwargs["max_tokens"] = self.max_tokens
        if tools:
            kwargs["tools"] = tools
            kwargs["tool_choice"] = tool_choice or "auto"
        if json_object:
            kwargs["response_format"] = {"type": "json_object"}
        limit = self.timeout_s if timeout_s is None else timeout_s
        start = time.perf_counter()
        try:
            # The outer wait_for bounds the whole request even if the server trickles bytes forever.
            response = await asyncio.wait_for(
                self._client.chat.completions.create(**kwargs, timeout=limit), timeout=limit
            )
        except (TimeoutError, openai.APITimeoutError) as exc:
            raise LLMTimeout(
                f"chat server {self._client.base_url} gave no answer within {limit:.1f} s"
            ) from exc
        except openai.APIStatusError as exc:
            raise LLMError(
                f"chat server {self._client.base_url} answered HTTP {exc.status_code}{_detail(exc)}"
            ) from exc
        except openai.APIError as exc:
            raise LLMError(f"chat server {self._client.base_url} failed: {exc}") from exc
        except ValueError as exc:  # the openai package lets JSON decoding errors of garbage bodies through
            raise LLMError(f"chat server {self._client.base_url} sent a body that is not JSON") from exc
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if not getattr(response, "choices", None):
            raise LLMError(f"chat server {self._client.base_url} sent a reply without choices")
        choice = response.choices[0]
        message = choice.message
        calls = [
            ToolCallRequest(name=c.function.name or "", arguments_json=c.function.arguments or "", id=c.id)
            for c in (message.tool_calls or [])
            if getattr(c, "function", None) is not None
        ]
        return ChatReply(
            content=message.content or "",
            tool_calls=calls,
            finish_reason=choice.finish_reason,
            elapsed_ms=elapsed_ms,
        )

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()


def _detail(exc: Any) -> str:
    """`: <the server's error message>` (one line, at most 200 characters), or nothing."""
    body = getattr(exc, "body", None)
    message = body.get("message") if isinstance(body, dict) else None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
    if not message:
        return ""
    return ": " + " ".join(str(message).split())[:200]
