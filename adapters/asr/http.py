"""ASR over HTTP with aiohttp: the OpenAI transcription API and the simple `POST /transcribe` protocol.

`OpenAITranscriptionClient` posts multipart/form-data (`file` = 16-bit WAV, `model`, optional `language`,
`response_format=json`) to `<base>/v1/audio/transcriptions` (OpenAI, vLLM's qwen-asr-serve,
faster-whisper-server, speaches...).

`TranscribeClient` speaks duetaspan's own minimal protocol:
    POST <url>            (default path `/transcribe`)
    Content-Type: audio/wav
    body: the 16-bit PCM mono WAV file itself (raw bytes, no multipart, no base64)
    optional query parameter `language`
    -> 200 {"text": "what time is it in tokyo"}     (any other status, or no "text" field, is an error)

Either reply may carry word times, as OpenAI's `verbose_json` with word granularity does:
`"words": [{"word": "what", "start": 0.0, "end": 0.2}, ...]` (seconds from the start of the posted audio); the
text then comes back as a `Transcript` with those `Word`s (what recording redaction needs). Malformed entries
are skipped.

Example:
    >>> client = TranscribeClient("http://127.0.0.1:8990/transcribe", timeout_s=5)
    >>> # text = await client.transcribe(pcm, 16000)
"""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np

from duetaspan.adapters.asr.base import ASRError, ASRTimeout, clean_transcript, wav_bytes
from duetaspan.errors import ConfigError
from duetaspan.router.ports import Transcript, Word


class _HTTPASR:
    def __init__(self, url: str, *, timeout_s: float, language: str | None, api_key: str | None) -> None:
        if not url:
            raise ConfigError("ASR: url is empty")
        self.url = url
        self.timeout_s = timeout_s
        self.language = language
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created lazily so that the session binds to the running loop, not the constructor's.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    async def _post(self, **kwargs) -> str:
        try:
            async with asyncio.timeout(self.timeout_s):
                async with self._client().post(self.url, **kwargs) as response:
                    if response.status != 200:
                        detail = (await response.text())[:200]
                        raise ASRError(f"ASR {self.url} answered HTTP {response.status}: {detail}")
                    try:
                        payload = await response.json(content_type=None)
                    except ValueError as exc:
                        raise ASRError(f"ASR {self.url} sent a reply that is not JSON") from exc
        except TimeoutError as exc:
            raise ASRTimeout(f"ASR {self.url} gave no answer within {self.timeout_s:.1f} s") from exc
        except aiohttp.ClientError as exc:
            raise ASRError(f"ASR {self.url} unreachable: {exc}") from exc
        if not isinstance(payload, dict) or not isinstance(payload.get("text"), str):
            raise ASRError(f'ASR {self.url} reply has no "text" field')
        text = clean_transcript(payload["text"])
        words = _words(payload.get("words"))
        return Transcript(text, words) if words else text

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _words(raw: object) -> list[Word]:
    """The reply's `words` as `Word`s (entries without a text and numeric times are skipped)."""
    out = []
    for w in raw if isinstance(raw, list) else ():
        if not isinstance(w, dict) or not isinstance(w.get("word"), str) or not str(w["word"]).strip():
            continue
        start, end = w.get("start"), w.get("end")
        if isinstance(start, (int, float)) and isinstance(end, (int, float)):
            out.append(Word(str(w["word"]).strip(), round(float(start), 3), round(float(end), 3)))
    return out


class OpenAITranscriptionClient(_HTTPASR):
    """`POST <base_url>/v1/audio/transcriptions` (multipart WAV). `base_url` may already end in `/v1`."""

    def __init__(
        self,
        base_url: str,
        model: str = "whisper-1",
        *,
        timeout_s: float = 5.0,
        language: str | None = None,
        api_key: str | None = None,
    ) -> None:
        url = base_url.rstrip("/")
        if not url.endswith("/audio/transcriptions"):
            url = (url if url.endswith("/v1") else url + "/v1") + "/audio/transcriptions"
        super().__init__(url, timeout_s=timeout_s, language=language, api_key=api_key)
        self.model = model

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        form = aiohttp.FormData()
        form.add_field("file", wav_bytes(pcm, sample_rate), filename="audio.wav", content_type="audio/wav")
        form.add_field("model", self.model)
        form.add_field("response_format", "json")
        if self.language:
            form.add_field("language", self.language)
        return await self._post(data=form)


class TranscribeClient(_HTTPASR):
    """`POST <url>` with a raw WAV body, answering `{"text": ...}`; a bare host gets `/transcribe` added."""

    def __init__(
        self, url: str, *, timeout_s: float = 5.0, language: str | None = None, api_key: str | None = None
    ) -> None:
        url = url.rstrip("/")
        if url.count("/") <= 2:  # "http://host:port" only
            url += "/transcribe"
        super().__init__(url, timeout_s=timeout_s, language=language, api_key=api_key)

    async def transcribe(self, pcm: np.ndarray, sample_rate: int) -> str:
        params = {"language": self.language} if self.language else None
        return await self._post(
            data=wav_bytes(pcm, sample_rate), headers={"Content-Type": "audio/wav"}, params=params
        )
