"""Build the ASR client an `ASRConfig` describes (`kind`: openai | transcribe | whisper | none).

Example:
    >>> from types import SimpleNamespace
    >>> type(asr_from_config(SimpleNamespace(kind="none"))).__name__
    'NullASR'
"""

from __future__ import annotations

import os
from typing import Any

from duetaspan.adapters.asr.base import ASRClient, NullASR
from duetaspan.adapters.asr.http import OpenAITranscriptionClient, TranscribeClient
from duetaspan.adapters.asr.whisper import DEFAULT_MODEL, FasterWhisperClient
from duetaspan.errors import ConfigError


def asr_from_config(config: Any) -> ASRClient:
    """An ASR client for `config` (a `duetaspan.config.ASRConfig` or anything with the same attributes)."""
    kind = getattr(config, "kind", "none")
    url = getattr(config, "url", None) or ""
    model = getattr(config, "model", None)
    timeout_s = float(getattr(config, "timeout_s", None) or 5.0)
    language = getattr(config, "language", None)
    key_env = getattr(config, "api_key_env", None)
    api_key = os.environ.get(key_env) if key_env else None
    if kind == "none":
        return NullASR()
    if kind == "openai":
        if not url:
            raise ConfigError("asr.url is required for kind 'openai' (e.g. http://127.0.0.1:8000/v1)")
        return OpenAITranscriptionClient(
            url, model or "whisper-1", timeout_s=timeout_s, language=language, api_key=api_key
        )
    if kind == "transcribe":
        if not url:
            raise ConfigError(
                "asr.url is required for kind 'transcribe' (e.g. http://127.0.0.1:8990/transcribe)"
            )
        return TranscribeClient(url, timeout_s=timeout_s, language=language, api_key=api_key)
    if kind == "whisper":
        return FasterWhisperClient(model or DEFAULT_MODEL, language=language, timeout_s=timeout_s)
    raise ConfigError(f"asr.kind must be one of openai, transcribe, whisper, none; got {kind!r}")
