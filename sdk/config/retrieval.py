"""The router side of a call: `[router]` (the LLM), `[asr]` (question capture), `[capture]` windows and the
`[retrieval]` deadline."""

from __future__ import annotations

import ipaddress
import os
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field

from duetaspan.config.base import _Section


class SideEffectToolConfig(_Section):
    """One tool's side-effect policy (`[router.side_effects.tools.<tool name>]`).

    Attributes:
        mode: this tool's mode; unset: `[router.side_effects] mode`.
        phrases: more words or phrases that count as the caller asking for this tool ("get us a table").
    """

    mode: Literal["keywords", "llm", "keywords+llm"] | None = None
    phrases: list[str] = Field(default_factory=list)


class SideEffectsConfig(_Section):
    """The side-effect policy (`[router.side_effects]`): how the router decides that the caller asked for a
    tool that acts on the world. Made-up arguments are refused in every mode (docs/router.md).

    Attributes:
        mode: "keywords" (deterministic: the tool's verbs and nouns, word forms, negations and
            self-corrections), "llm" (the router's model is asked "did the caller ask for this?", shown only
            the caller's words; the keyword check decides when it fails) or "keywords+llm" (the judge only
            for what the keywords refuse). Unset: "keywords+llm" when the router can reach its model (its
            `api_key_env` is set, or its `base_url` needs no key: a loopback or private-network server, or
            `api_key_env = ""`), "keywords" otherwise.
        judge_timeout_s: the judge's time limit (within the retrieval deadline); past it the keywords decide.
        tools: per-tool settings, by tool name.
    """

    mode: Literal["keywords", "llm", "keywords+llm"] | None = None
    judge_timeout_s: float = Field(1.5, gt=0)
    tools: dict[str, SideEffectToolConfig] = Field(default_factory=dict)


class RouterConfig(_Section):
    """The router's LLM: any OpenAI-compatible chat-completions endpoint.

    `mode="native"` sends the tools with the API's `tools=`; `mode="json"` puts the catalogue in the prompt
    and parses a JSON reply (for servers without tool-call parsing).

    Attributes:
        base_url: the endpoint's `/v1` root (OpenAI, vLLM, llama.cpp, Ollama, LM Studio ...).
        model: the model name the endpoint expects.
        api_key_env: environment variable holding the API key (unset or empty: no key sent).
        mode: "native" (tool calling) or "json" (catalogue in the prompt, JSON reply).
        timeout_s: one LLM request's time limit (the retrieval deadline still applies).
        temperature: sampling temperature of the router's LLM (0: deterministic routing).
        max_tokens: reply length limit (tool calls, several for a two-part request, or one short sentence).
        side_effects: the side-effect policy (`[router.side_effects]`).
    """

    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4.1-mini"
    api_key_env: str | None = "OPENAI_API_KEY"
    mode: Literal["native", "json"] = "native"
    timeout_s: float = Field(8.0, gt=0)
    temperature: float = Field(0.0, ge=0, le=2)
    max_tokens: int = Field(512, gt=0)
    side_effects: SideEffectsConfig = Field(default_factory=SideEffectsConfig)

    def api_key(self) -> str | None:
        """The key from the environment variable `api_key_env` (None when unset)."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def reachable(self) -> tuple[bool, str]:
        """Whether the router can reach its model, and why: its key variable is set, or its `base_url` needs
        no key (a loopback or private-network server, or `api_key_env = ""`: no key wanted)."""
        if self.api_key_env and os.environ.get(self.api_key_env):
            return True, f"key {self.api_key_env} is set"
        if not self.api_key_env:
            return True, 'no key wanted (api_key_env = "")'
        if keyless_url(self.base_url):
            return True, f"a local server (no key needed; {self.api_key_env} is not set)"
        return False, f"key {self.api_key_env} is not set"

    def side_effect_mode(self) -> Literal["keywords", "llm", "keywords+llm"]:
        """The side-effect policy's mode: `[router.side_effects] mode`, or when unset "keywords+llm" if the
        router can reach its model (`reachable`) and "keywords" if not."""
        if self.side_effects.mode is not None:
            return self.side_effects.mode
        return "keywords+llm" if self.reachable()[0] else "keywords"


def keyless_url(url: str | None) -> bool:
    """A server on this machine or a private network (`localhost`, 127.x, 10.x, 192.168.x, a one-label host
    such as a container's name): such servers usually want no key."""
    host = (urlsplit(url or "").hostname or "").lower()
    if not host:
        return False
    if host == "localhost" or host.endswith((".localhost", ".local", ".internal")) or "." not in host:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


class ASRConfig(_Section):
    """Transcription of the caller's question: an OpenAI-compatible endpoint, a `POST /transcribe` server,
    in-process faster-whisper, or none.

    Attributes:
        kind: "openai" (`/audio/transcriptions`), "transcribe" (`POST` a wav to `url`), "whisper"
            (faster-whisper in process, `pip install duetaspan[whisper]`) or "none" (no question capture).
        url: the endpoint; for "openai" unset means the router's `base_url`.
        model: the ASR model: for "openai" the endpoint's model name (unset: "whisper-1"); for "whisper" a
            faster-whisper size ("tiny.en", "base.en", "small.en", ...: downloaded on first use; unset:
            "base.en") or a local folder holding model.bin, config.json, tokenizer.json, vocabulary.txt.
        api_key_env: environment variable holding the ASR key (for "openai" without a `url`, unset here
            means the router's `api_key_env`).
        language: ISO code hint ("en"); unset: detect.
        timeout_s: one transcription's time limit.
    """

    kind: Literal["openai", "transcribe", "whisper", "none"] = "openai"
    url: str | None = None
    model: str | None = None
    api_key_env: str | None = "OPENAI_API_KEY"
    language: str | None = None
    timeout_s: float = Field(5.0, gt=0)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None


class CaptureConfig(_Section):
    """Question capture at `<ret>`: how far back a final utterance counts, how long to wait for one in
    progress, the silence that ends an utterance, and the audio window transcribed as a fallback.

    Attributes:
        final_window_s: a caller utterance that ended this recently before `<ret>` is the question.
        wait_s: when the caller is still speaking at `<ret>`, wait this long for the utterance to end.
        silence_s: while waiting, this much silence ends the utterance.
        fallback_window_s: otherwise transcribe this much recent caller audio as the question.
    """

    final_window_s: float = Field(3.0, ge=0)
    wait_s: float = Field(1.0, ge=0)
    silence_s: float = Field(0.4, gt=0)
    fallback_window_s: float = Field(12.0, gt=0)


class RetrievalConfig(_Section):
    """The retrieval lifecycle: the deadline from `<ret>` to a landed span, and the reference's size cap.

    Attributes:
        deadline_s: from `<ret>` to the span landing; later references are dropped (a `late_span` event).
        max_reference_tokens: references are cut (at a word) to about this many tokens.
    """

    deadline_s: float = Field(2.5, gt=0)
    max_reference_tokens: int = Field(250, gt=0)


__all__ = [
    "ASRConfig",
    "CaptureConfig",
    "RetrievalConfig",
    "RouterConfig",
    "SideEffectToolConfig",
    "SideEffectsConfig",
    "keyless_url",
]
