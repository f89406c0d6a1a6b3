"""The scripted servers of `duetaspan.testing` as a real OpenAI client sees them: rules, several tool calls in
one reply in OpenAI's shape, text, HTTP errors, delays, hangs, recorded requests; the transcription server;
and both command lines (`python -m duetaspan.testing.llm` / `.asr`) serving a script file."""

from __future__ import annotations

import asyncio
import io
import json
import sys
import wave

import aiohttp
import numpy as np
import pytest
from openai import APIConnectionError, APIStatusError, APITimeoutError, AsyncOpenAI

from duetaspan.testing import ScriptedASR, ScriptedLLM, content, delay, error, hang, tool_call, tool_calls
from duetaspan.testing.servers import free_port


def _client(base_url: str, **kw) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, **kw)


async def _ask(client: AsyncOpenAI, text: str):
    return await client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])


async def test_rules_answer_with_tool_calls_in_openais_shape():
    llm = ScriptedLLM({"weather and time": tool_calls(tool_call("get_weather", city="Paris"),
                                                      ("get_time", {"place": "Paris"})),
                       "book": tool_call("book_table", people=4)})  # fmt: skip
    async with llm as base_url:
        assert base_url == llm.base_url and base_url.endswith("/v1")
        client = _client(base_url)
        both = await _ask(client, "What's the weather and time in Paris?")
        one = await _ask(client, "please BOOK for four")
        nothing = await _ask(client, "hello")
        await client.close()
    [choice] = both.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris"}),
        ("function", "get_time", {"place": "Paris"}),
    ]
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)
    assert [c.function.name for c in one.choices[0].message.tool_calls] == ["book_table"]
    assert nothing.choices[0].finish_reason == "stop" and not nothing.choices[0].message.tool_calls
    assert llm.questions == ["What's the weather and time in Paris?", "please BOOK for four", "hello"]
    assert [r["model"] for r in llm.requests] == ["m", "m", "m"]


async def test_steps_content_errors_delays_and_hangs():
    llm = ScriptedLLM({"steps": [content("It is 7 PM."), error(503, "overloaded"), delay(0.3, content("late")),
                                 hang()]})  # fmt: skip
    async with llm as base_url:
        client = _client(base_url)
        assert (await _ask(client, "a")).choices[0].message.content == "It is 7 PM."
        with pytest.raises(APIStatusError) as failed:
            await _ask(client, "b")
        assert failed.value.status_code == 503 and "overloaded" in str(failed.value)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert (await _ask(client, "c")).choices[0].message.content == "late"
        assert loop.time() - t0 >= 0.3
        with pytest.raises(APITimeoutError):
            await _client(base_url, timeout=0.5).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "d"}]
            )
        await client.close()
    assert len(llm.requests) == 4


def _wav(seconds: float, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.zeros(int(rate * seconds), "<i2").tobytes())
    return buf.getvalue()


async def test_asr_hears_what_it_is_told_and_records_the_audio():
    asr = ScriptedASR({"steps": ["first"], "default": ""})
    async with asr as base_url:
        client = _client(base_url)
        first = await client.audio.transcriptions.create(model="whisper-1", file=("q.wav", _wav(1.0)))
        asr.hears("please book a table")
        async with aiohttp.ClientSession() as http:
            async with http.post(asr.transcribe_url, data=_wav(0.5, 8000)) as resp:
                second = await resp.json()
            async with http.post(asr.transcribe_url, data=b"not a wav") as resp:
                assert resp.status == 400
        await client.close()
    assert first.text == "first" and second == {"text": "please book a table"}
    assert [(r["path"], r["sample_rate"], r["seconds"], r["model"]) for r in asr.requests] == [
        ("/v1/audio/transcriptions", 16000, 1.0, "whisper-1"),
        ("/transcribe", 8000, 0.5, None),
    ]


@pytest.mark.parametrize("module", ["llm", "asr"])
async def test_command_line_serves_a_script_file(tmp_path, module):
    script = tmp_path / "script.json"
    if module == "llm":
        script.write_text(json.dumps({"rules": [{"match": "time", "reply": tool_call("get_time")}]}))
    else:
        script.write_text(json.dumps({"default": "what time is it"}))
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", f"duetaspan.testing.{module}", "--port", str(port), "--script", str(script),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.decode().strip() == f"serving on http://127.0.0.1:{port}/v1"
        client = _client(f"http://127.0.0.1:{port}/v1")
        for _ in range(200):  # the banner comes just before the socket listens
            try:
                if module == "llm":
                    reply = await _ask(client, "what time is it?")
                    assert reply.choices[0].message.tool_calls[0].function.name == "get_time"
                else:
                    reply = await client.audio.transcriptions.create(model="w", file=("q.wav", _wav(0.2)))
                    assert reply.text == "what time is it"
                break
            except APIConnectionError:  # refused until it listens
                await asyncio.sleep(0.05)
        else:
            raise AssertionError("the scripted server never answered")
        await client.close()
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 15)
