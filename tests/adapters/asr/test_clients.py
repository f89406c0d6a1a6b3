"""ASR clients against the scripted ASR server (both protocols) over real loopback HTTP."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from duetaspan.adapters.asr import (
    ASRClient,
    ASRError,
    ASRTimeout,
    FasterWhisperClient,
    NullASR,
    OpenAITranscriptionClient,
    TranscribeClient,
    asr_from_config,
    clean_transcript,
)
from duetaspan.errors import AudioFormatError, ConfigError
from tests.fakes.asr_server import ScriptedASRServer
from tests.support import load_wav


async def test_openai_protocol_sends_multipart_wav_and_model():
    pcm, rate = load_wav("time_tokyo")
    server = ScriptedASRServer({"steps": ["language English<asr_text>What time is it in Tokyo?"]})
    async with server.serve() as url:
        client = OpenAITranscriptionClient(url, model="qwen3-asr", language="en")
        assert isinstance(client, ASRClient)
        assert await client.transcribe(pcm, rate) == "What time is it in Tokyo?"
        await client.aclose()
    (request,) = server.requests
    assert request["path"] == "/v1/audio/transcriptions" and request["model"] == "qwen3-asr"
    assert request["sample_rate"] == rate and request["seconds"] == pytest.approx(len(pcm) / rate, abs=1e-3)
    assert request["language"] == "en"


async def test_transcribe_protocol_sends_raw_wav_body():
    pcm = np.zeros(16000, dtype=np.float32)
    server = ScriptedASRServer({"default": "  hello   there "})
    async with server.serve() as url:
        client = TranscribeClient(url)  # bare host: /transcribe is added
        assert await client.transcribe(pcm, 16000) == "hello there"
        await client.aclose()
    assert server.requests[0]["path"] == "/transcribe" and server.requests[0]["seconds"] == 1.0


async def test_failures_are_asr_errors(free_port):
    pcm = np.zeros(8000, dtype=np.float32)
    server = ScriptedASRServer({"steps": [{"status": 500}, {"body": "nope"}, {"hang": True}]})
    async with server.serve() as url:
        client = TranscribeClient(url + "/transcribe", timeout_s=0.3)
        with pytest.raises(ASRError, match="HTTP 500"):
            await client.transcribe(pcm, 16000)
        with pytest.raises(ASRError, match="not JSON"):
            await client.transcribe(pcm, 16000)
        start = time.perf_counter()
        with pytest.raises(ASRTimeout):
            await client.transcribe(pcm, 16000)
        assert time.perf_counter() - start < 1.5
        await client.aclose()
    down = TranscribeClient(f"http://127.0.0.1:{free_port}/transcribe", timeout_s=2)
    with pytest.raises(ASRError, match="unreachable"):
        await down.transcribe(pcm, 16000)
    await down.aclose()
    with pytest.raises(AudioFormatError):
        await down.transcribe(np.zeros(0, dtype=np.float32), 16000)


async def test_factory_and_null_asr(monkeypatch):
    assert isinstance(asr_from_config(SimpleNamespace(kind="none")), NullASR)
    assert await NullASR().transcribe(np.zeros(10, dtype=np.float32), 16000) == ""
    client = asr_from_config(SimpleNamespace(kind="openai", url="http://h:1/v1", model="m", timeout_s=3))
    assert (
        isinstance(client, OpenAITranscriptionClient) and client.url == "http://h:1/v1/audio/transcriptions"
    )
    assert isinstance(asr_from_config(SimpleNamespace(kind="transcribe", url="http://h:1")), TranscribeClient)
    assert isinstance(asr_from_config(SimpleNamespace(kind="whisper", model="tiny.en")), FasterWhisperClient)
    with pytest.raises(ConfigError, match="url"):
        asr_from_config(SimpleNamespace(kind="openai", url=""))
    with pytest.raises(ConfigError, match="kind"):
        asr_from_config(SimpleNamespace(kind="sphinx"))


async def test_whisper_without_the_extra_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "faster_whisper", None)  # import now fails like a missing package
    client = FasterWhisperClient("tiny.en")
    with pytest.raises(ConfigError, match=r"duetaspan\[whisper\]"):
        await client.transcribe(np.zeros(1600, dtype=np.float32), 16000)


def test_clean_transcript():
    assert clean_transcript("language Korean<asr_text>안녕") == "안녕"
    assert clean_transcript("") == ""
