"""The retrieval lifecycle over real HTTP (scripted LLM and ASR servers) and a real ToolRegistry."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from duetaspan.adapters.asr import TranscribeClient
from duetaspan.adapters.llm import ChatClient
from duetaspan.registry import CallContext
from duetaspan.router import ContextDB, QuestionCapture, RetrievalManager, Router
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.router.tools import make_registry
from tests.support import load_wav


def call(name: str, **arguments) -> dict:
    return {"tool_call": {"name": name, "arguments": arguments}}


class Harness:
    """A manager wired to a scripted LLM; records deliveries and events."""

    def __init__(self, url: str, deadline_s: float = 2.5, capture=None, llm_timeout_s: float = 8.0):
        from duetaspan.config import RetrievalConfig

        self.delivered: list[tuple[str, object]] = []
        self.events: list = []
        self.ctx = CallContext(call_id="CA1")
        self.db = ContextDB(ctx=self.ctx)
        self.router = Router(make_registry(), ChatClient(url, "fake", api_key="k", timeout_s=llm_timeout_s))
        self.manager = RetrievalManager(
            router=self.router,
            deliver=lambda reference, meta: self.delivered.append((reference, meta)),
            capture=capture,
            on_event=self.events.append,
            db=self.db,
            config=RetrievalConfig(deadline_s=deadline_s),
        )

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


async def test_delivers_a_tool_reference_with_events_and_records_the_tool_turn():
    server = ScriptedLLMServer({"rules": [{"match": "weather", "reply": call("get_weather", city="Sydney")}]})
    async with server.serve() as url:
        h = Harness(url)
        assert h.manager.on_ret(100, 8.0, question="what's the weather in sydney")
        await h.manager.wait()
        await h.router.aclose()
    ((reference, meta),) = h.delivered
    assert reference == "(tool result) Sydney: 21°C, clear sky."
    assert meta.frame_index == 100 and meta.source == "tool:get_weather" and meta.call_id == "CA1"
    assert h.kinds() == ["ret", "question", "tool", "router", "reference", "delivered"]
    for event in h.events:
        json.loads(event.model_dump_json())
    assert h.db.tool_turns()[0].name == "get_weather" and h.events[-1].total_ms > 0


async def test_second_ret_in_flight_is_deduplicated():
    server = ScriptedLLMServer({"default": call("get_weather", city="Oslo") | {"delay_s": 0.3}})
    async with server.serve() as url:
        h = Harness(url)
        assert h.manager.on_ret(10, question="weather in oslo")
        assert not h.manager.on_ret(11, question="weather in oslo")
        await h.manager.wait()
        assert h.manager.on_ret(12, question="weather in oslo again")  # free again afterwards
        await h.manager.wait()
        await h.router.aclose()
    dedup = [e for e in h.events if e.kind == "ret" and e.deduplicated]
    assert len(dedup) == 1 and dedup[0].frame_index == 11 and len(h.delivered) == 2
    assert len(server.requests) == 2


async def test_deadline_cancels_a_hanging_tool_and_drops_the_span():
    server = ScriptedLLMServer({"default": call("slow_tool", query="x")})
    async with server.serve() as url:
        h = Harness(url, deadline_s=0.5)
        loop = asyncio.get_running_loop()
        start = loop.time()
        h.manager.on_ret(5, question="look it up")
        await h.manager.wait()
        assert loop.time() - start < 1.0
        await h.router.aclose()
    assert h.delivered == [] and h.kinds()[-1] == "late" and h.events[-1].stage == "router"


async def test_deadline_cancels_a_hanging_llm():
    server = ScriptedLLMServer({"default": {"hang": True}})
    async with server.serve() as url:
        h = Harness(url, deadline_s=0.4)
        h.manager.on_ret(5, question="weather")
        await h.manager.wait()
        await h.router.aclose()
    assert h.delivered == [] and h.kinds()[-1] == "late"


async def test_hangup_during_retrieval_delivers_nothing_afterwards():
    server = ScriptedLLMServer({"default": call("get_weather", city="Oslo") | {"delay_s": 0.3}})
    async with server.serve() as url:
        h = Harness(url)
        h.manager.on_ret(5, question="weather in oslo")
        await asyncio.sleep(0.05)
        await h.manager.close()
        await asyncio.sleep(0.5)  # the LLM answers by now; nothing may land
        assert not h.manager.on_ret(6, question="weather in oslo")
        await h.router.aclose()
    assert h.delivered == [] and h.kinds()[-1] == "cancelled"


async def test_failures_become_events_and_later_rets_still_work():
    server = ScriptedLLMServer(
        {
            "steps": [
                {"status": 500},
                {"content": "~~~ ### 0x"},
                {"content": "~~~"},
                call("broken_tool", query="q"),
            ]
        }
    )
    async with server.serve() as url:
        h = Harness(url)
        for frame in (1, 2, 3):
            h.manager.on_ret(frame, question="something")
            await h.manager.wait()
        await h.router.aclose()
    errors = [e for e in h.events if e.kind in ("error", "no_span", "delivered")]
    assert [e.kind for e in errors] == ["error", "no_span", "delivered"]
    assert errors[0].stage == "router" and "500" in errors[0].error
    assert h.delivered[0][0] == "(no information found)"  # the tool ran and failed


async def test_deliver_exceptions_do_not_break_the_manager():
    server = ScriptedLLMServer({"default": {"content": "Mount Everest is the highest mountain on Earth."}})
    async with server.serve() as url:
        h = Harness(url)

        def bad_deliver(reference, meta):
            raise RuntimeError("engine gone")

        h.manager.deliver = bad_deliver
        h.manager.on_ret(1, question="highest mountain?")
        await h.manager.wait()
        assert h.kinds()[-1] == "error" and h.events[-1].stage == "deliver"
        h.manager.deliver = lambda r, m: h.delivered.append((r, m))
        h.manager.on_ret(2, question="highest mountain?")
        await h.manager.wait()
        await h.router.aclose()
    assert h.delivered[0][0] == "Mount Everest is the highest mountain on Earth."


async def test_a_span_the_engine_refuses_is_a_failed_delivery_not_delivered():
    """`deliver` returning False (the call's slot has ended) is `error` at stage `deliver`, never `delivered`."""
    server = ScriptedLLMServer({"default": {"content": "Mount Everest is the highest mountain on Earth."}})
    async with server.serve() as url:
        h = Harness(url)
        h.manager.deliver = lambda reference, meta: False
        h.manager.on_ret(1, question="highest mountain?")
        await h.manager.wait()

        async def accepted(reference, meta):  # an async deliver's answer counts the same way
            h.delivered.append((reference, meta))
            return True

        h.manager.deliver = accepted
        h.manager.on_ret(2, question="highest mountain?")
        await h.manager.wait()
        await h.router.aclose()
    first = [e.kind for e in h.events if e.retrieval_id == 1]
    assert first[-1] == "error" and "delivered" not in first, first
    [failed] = [e for e in h.events if e.kind == "error"]
    assert failed.stage == "deliver" and "refused" in failed.error
    assert [e.kind for e in h.events if e.retrieval_id == 2][-1] == "delivered" and len(h.delivered) == 1


async def feed_frames(capture: QuestionCapture, audio: np.ndarray, rate: int, t0: float = 0.0) -> float:
    for i in range(0, len(audio) - 1919, 1920):
        await capture.feed(audio[i : i + 1920], rate, t0 + i / rate)
    return t0 + (len(audio) // 1920) * 1920 / rate


async def test_audio_to_span_with_silero_and_asr_down_or_slow():
    """Capture with real Silero over fixture audio; the ASR server first answers, then fails, then is slow."""
    pcm, rate = load_wav("weather_sydney")
    silence = np.zeros(rate, dtype=np.float32)
    asr = ScriptedASRServer(
        {"steps": ["What's the weather like in Sydney right now?", {"status": 503}, {"status": 503}]}
    )
    llm = ScriptedLLMServer({"rules": [{"match": "sydney", "reply": call("get_weather", city="Sydney")}]})
    async with asr.serve() as asr_url, llm.serve() as llm_url:
        client = TranscribeClient(asr_url + "/transcribe", timeout_s=2.0)
        h = Harness(llm_url)
        capture = QuestionCapture(client, on_utterance=lambda u: h.db.add_utterance(u.text, u.end))
        h.manager.capture = capture
        t = await feed_frames(capture, np.concatenate([silence, pcm, silence]), rate)
        h.manager.on_ret(int(t * 12.5), t)
        await h.manager.wait()
        assert h.delivered[0][0] == "(tool result) Sydney: 21°C, clear sky."
        question = next(e for e in h.events if e.kind == "question")
        assert question.how == "final" and 2.5 < question.audio_s < 5.0
        assert asr.requests[0]["sample_rate"] == 16000
        # ASR down: the next utterance's final fails, then the window fallback fails -> error, no span
        t = await feed_frames(capture, np.concatenate([pcm, silence]), rate, t)
        h.manager.on_ret(int(t * 12.5), t)
        await h.manager.wait()
        assert h.kinds()[-1] == "error" and h.events[-1].stage == "capture" and len(h.delivered) == 1
        # reported as the backend's failure (a `TranscriptionError`), not as a bug with its exception type
        assert h.events[-1].error.startswith("ASR ") and "HTTP 503" in h.events[-1].error
        # ASR slow: the deadline expires during capture
        asr.default = {"text": "what time is it", "delay_s": 1.5}
        h.manager.deadline_s = 0.5
        t = await feed_frames(capture, np.concatenate([pcm, silence]), rate, t)
        h.manager.on_ret(int(t * 12.5), t)
        await h.manager.wait()
        assert h.kinds()[-1] == "late" and h.events[-1].stage == "capture"
        await capture.aclose()
        await client.aclose()
        await h.router.aclose()
    assert h.db.caller_utterances()[0] == "What's the weather like in Sydney right now?"
