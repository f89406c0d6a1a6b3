"""Calls on a real speech recogniser: the agent's `[asr] kind = "whisper"` on the pinned tiny.en
(tests/whisper_model.py, loaded once per test process), the fixture questions said by the scripted caller,
captured by the real pipeline (Silero VAD, question capture) and transcribed by the real model, the router
(scripted LLM on loopback) and the side-effect policy fed what the model heard. Over the in-process loopback
line (24 kHz) and over a real Twilio Media Streams socket (8 kHz mu-law both ways).

A real recogniser makes real errors: over the phone line tiny.en hears the `book_table` fixture ("I'd like to
book a table for four people at seven tonight") without its verb, and here without its time. The keyword check
never guesses a misheard word (docs/router.md): it reads the request from the rest of the sentence, refuses a
value nobody said, and with a reachable model (`keywords+llm`) leaves a refused action to the judge."""

from __future__ import annotations

import re
import sys

import pytest

from duetaspan import Agent, tool
from duetaspan.router import ContextDB
from duetaspan.router.grounding import Grounding, arguments_grounded
from duetaspan.router.policy import SideEffectPolicy
from duetaspan.testing import content, scripted_call, tool_call
from tests.support import REPO_ROOT, fixture_phrase

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from asr import wer

sys.path.pop(0)

# generous for a real model on a busy 2-core CPU: what is tested is what it heard, not how fast
SLOW_CPU = {"deadline_s": 20.0}


@tool(side_effect=True)
def book_table(people: int, time: str) -> str:
    """Book a table tonight. Only when the caller asks to book.

    Args:
        people: party size
        time: e.g. "7 PM"
    """
    return f"Booked a table for {people} at {time} tonight."


def _agent(engine, folder, tmp_path, **kwargs) -> Agent:
    return Agent(persona="You are Ada.", engine=engine, max_calls=1, seed=0, record_dir=tmp_path,
                 asr={"kind": "whisper", "model": str(folder), "timeout_s": 30}, retrieval=SLOW_CPU,
                 **kwargs)  # fmt: skip


async def test_a_loopback_call_is_heard_by_the_real_model_with_word_times(
    tiny_engine, scripted_llm, whisper_folder, whisper_asr, tmp_path
):
    scripted_llm.on("tokyo", tool_call("get_time", place="Tokyo"))
    agent = _agent(tiny_engine, whisper_folder, tmp_path, builtins=["get_time"])
    async with scripted_call(agent, "+15550001", llm=scripted_llm, call_id="CA-whisper-loop") as call:
        await call.say("time_tokyo", silence_s=1.2)  # "What time is it in Tokyo at the moment?"
        outcome = await call.ask(timeout=60)
    outcome.expect_tool("get_time", place="Tokyo").expect_span(contains="Tokyo")
    heard = outcome.question or ""
    # what the pipeline captured (VAD cut, levelled, 24 -> 16 kHz) is not the file: tiny.en hears it nearly right
    assert "Tokyo" in heard and wer(fixture_phrase("time_tokyo"), heard) <= 0.5, heard
    (question,) = outcome._of("question")
    words = question["words"]
    assert [w["word"] for w in words] == heard.split()
    # word times are the call's stream times: the caller's speech started after the call did
    assert 0.0 <= words[0]["start"] <= words[-1]["end"] and all(w["start"] <= w["end"] for w in words)
    record = call.record
    assert record is not None and record["complete"]
    (utterance,) = [u for u in record["caller_utterances"] if "Tokyo" in u["text"]]
    assert utterance["words"] == words  # the call's record keeps them (the privacy work needs word times)
    assert utterance["start"] - 0.5 <= words[0]["start"] and words[-1]["end"] <= utterance["end"] + 0.5


async def test_a_twilio_call_goes_through_the_guard_on_what_the_real_model_heard(
    tiny_engine, scripted_llm, whisper_folder, whisper_asr, tmp_path, monkeypatch
):
    """Caller audio through 8 kHz mu-law on a real Media Streams socket, heard by tiny.en (here: "I'd like to
    work out able for four people at heaven to die." or "I'd like to work a table for 4 people at 7 tonight.",
    by where the line's steady audio puts the VAD's cuts). The router asks to book for four at 7 PM; the guard
    decides on what was heard: it books when the words carry the request and its values, refuses a value
    nobody said ("seven" heard as "heaven": never shown to the judge), and leaves only a refused action to the
    judge (the default `keywords+llm`, the router's server being on loopback)."""
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "the-users-own-token")
    monkeypatch.delenv("TWILIO_ACCOUNT_SID", raising=False)
    # the judge's request carries the caller's words under this heading; the router's does not
    scripted_llm.on("CALLER'S LATEST REQUEST", content('{"asked": true, "reason": "asks to book a table"}'))
    for party in ("for four", "for 4"):  # tiny.en writes the number either way, by where the VAD cut falls
        scripted_llm.on(party, tool_call("book_table", people=4, time="7 PM"))
    agent = _agent(tiny_engine, whisper_folder, tmp_path, tools=[book_table])
    async with scripted_call(agent, "+15550004444", transport="twilio", llm=scripted_llm) as call:
        assert agent.config.router.side_effect_mode() == "keywords+llm"
        await call.say("book_table", silence_s=1.2)
        outcome = await call.ask(timeout=60)
    heard = outcome.question or ""
    assert re.search(r"\bfor (four|4)\b", heard.lower()) and wer(fixture_phrase("book_table"), heard) < 1.0, heard
    judged = [r for r in scripted_llm.requests if "CALLER'S LATEST REQUEST" in str(r["messages"][-1])]
    args = {"people": 4, "time": "7 PM"}
    asked = (
        await SideEffectPolicy("keywords").check(book_table.spec, args, question=heard, db=ContextDB())
    ).allowed
    grounded, why = arguments_grounded(book_table.spec, args, Grounding.of(heard, [], []))
    if not grounded:  # a value that was not heard: refused whatever the action, the judge never asked
        outcome.expect_refused(reason=why, tool="book_table").expect_no_tool()
        assert not judged
    elif asked:
        outcome.expect_tool("book_table", **args).expect_span(contains="Booked a table")
        assert not judged
    else:  # the action was not heard: the judge (scripted: yes) decides
        outcome.expect_tool("book_table", **args)
        assert len(judged) == 1
    assert call.record is not None and call.record["meta"]["transport"] == "twilio"
    assert call.record["caller_utterances"][0]["words"]


@pytest.mark.parametrize("mode", ["keywords", "keywords+llm"])
async def test_a_near_miss_action_word_is_neither_guessed_nor_needed(mode, scripted_llm):
    """What tiny.en heard over the phone (the issue's transcript): "work" for "book". The keyword check does
    not guess sound-alikes (that would turn "look at a table" into a booking): it reads the request from the
    rest of the sentence, a request frame ("I'd like") with the tool's noun and every value of the call in the
    caller's words, so the booking runs and no judge is asked. A near miss that leaves a question ("I'd like
    to look at a table ...") is refused; `keywords+llm` then asks the judge (here it says no). A made-up
    argument is refused in both modes without asking it (this judge would say yes to it)."""
    from duetaspan.adapters.llm import ChatClient

    # a judge that would wave a made-up party size through: it must never be asked about one
    scripted_llm.on(["CALLER'S LATEST REQUEST", '"people": 6'], content('{"asked": true, "reason": "sure"}'))
    scripted_llm.on("CALLER'S LATEST REQUEST", content('{"asked": false, "reason": "only looking"}'))
    judge = ChatClient(scripted_llm.base_url, "scripted")
    policy = SideEffectPolicy(mode, llm=judge)  # type: ignore[arg-type]
    args = {"people": 4, "time": "7 PM"}
    misheard = "I'd like to work a table for four people at seven tonight"
    looking = "I'd like to look at a table for four people at seven tonight"
    try:
        booked = await policy.check(book_table.spec, args, question=misheard, db=ContextDB())
        assert booked.allowed and booked.how == "keywords" and not scripted_llm.requests
        for question in (misheard, looking):  # heard as asked or not: six was never said
            made_up = await policy.check(
                book_table.spec, {**args, "people": 6}, question=question, db=ContextDB()
            )
            assert not made_up.allowed and not scripted_llm.requests, made_up
            # the keywords say what they found first; with a judge both (and no judge was asked)
            assert "people" in made_up.reason or (mode == "keywords" and question == looking)
            if mode == "keywords+llm" and question == looking:
                assert made_up.reason.startswith("the caller did not ask for 'book_table'; argument 'people'")
        refused = await policy.check(book_table.spec, args, question=looking, db=ContextDB())
    finally:
        await judge.aclose()
    assert not refused.allowed
    if mode == "keywords":
        assert "did not ask for 'book_table'" in refused.reason and not scripted_llm.requests
    else:
        assert refused.how == "llm" and "only looking" in refused.reason and len(scripted_llm.requests) == 1
