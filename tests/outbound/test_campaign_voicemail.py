"""A campaign whose callees are answering machines and a person, dialled over real SIP with answer detection on
(`[outbound] detect`), on both stores: the who-answered outcomes are the attempts' outcomes and drive
`[campaign.retry]` per outcome.

Each number is a SIPp UAS (`callee_greets.xml`: real SIP, its SDP naming the number's RTP peer,
`tests/adapters/sip/rtp_peer.py`, which plays the callee's recording as paced PCMU and records what the agent
sends). Two numbers are voicemail boxes (a greeting, then a 900 Hz beep), one is a person ("Hello, Priya
here." then silence; SIPp hangs up). With `voicemail_left = {delay_s = 1}` and `max_attempts = 2`: each box is
dialled exactly twice, each time the agent's message (a repo wav) reaches the callee after the beep and
nothing audible before it, the attempt ends `voicemail_left`; the person is dialled once and ends `human` (no
rule for it: final). Status, its one-line form and the export say so, each attempt's call record too, and
afterwards no call slot, SIP call or RTP port is held."""

from __future__ import annotations

import asyncio
import csv
import datetime as dt
import io
import json
import time
import wave
from dataclasses import dataclass, field

import numpy as np
import pytest

from duetaspan.adapters.sip.bridge import agent_call_handler
from duetaspan.agent import Agent
from duetaspan.agent.dialing import dial_slots
from duetaspan.config import AgentConfig
from duetaspan.config.store import CampaignConfig, RetryRule
from duetaspan.outbound import read_wav
from duetaspan.outbound.contacts import parse_contacts
from duetaspan.outbound.handle import CampaignHandle, create_campaign
from duetaspan.outbound.scheduler import AgentDialer, CampaignRunner
from duetaspan.outbound.status import status_line
from duetaspan.store import Clock, open_store
from tests.adapters.sip.peer import (
    drain,
    endpoint_on_loopback,
    free_udp_port,
    needs_sipp,
    run_sipp,
    scenario,
    sip_e2e,
    udp_bound,
    udp_socket,
    wait_for,
)
from tests.adapters.sip.rtp_peer import RtpPeer, to_ulaw
from tests.outbound.conftest import assert_nothing_held, cancel_all
from tests.outbound.test_answer_sip import ANSWERS, LABELS, _match

# serial: the verdicts and the agent's audio run in real time against the callees' clocks; beside two busy
# cores the person's 4 s call ended before its verdict (`answered`, not `human`) or before the agent spoke
pytestmark = [needs_sipp, sip_e2e, pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(600)]

MONDAY_NOON_UTC = dt.datetime(2026, 3, 2, 12, 0, tzinfo=dt.UTC).timestamp()
MESSAGE_S = 1.8  # the message left: hello.wav's words (1.6 s), not its trailing silence (CI time)


@dataclass
class Callee:
    """One number: its SIPp (signalling), its RTP socket (every call's media), what it plays, its calls."""

    number: str
    fixture: str
    calls: int  # how many calls its SIPp takes
    talk_ms: int  # SIPp hangs up this long after the ACK when the agent has not
    sock: object = field(default_factory=udp_socket)
    sip_port: int = field(default_factory=free_udp_port)
    peers: list[RtpPeer] = field(default_factory=list)  # one per call, in order

    @property
    def uri(self) -> str:
        return f"sip:{self.number}@127.0.0.1:{self.sip_port}"


def _message(tmp_path) -> tuple[str, np.ndarray]:
    pcm, rate = read_wav(str(ANSWERS / "hello.wav"))
    pcm = pcm[: int(MESSAGE_S * rate)]
    path = tmp_path / "message.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes((np.clip(pcm, -1, 1) * 32767).astype("<i2").tobytes())
    return str(path), pcm


async def test_voicemail_and_person_outcomes_drive_the_retries(tmp_path, store_target):
    message_path, message_pcm = _message(tmp_path)
    callees = [Callee("+442079461001", "greeting_beep.wav", 2, 30000),
               Callee("+442079461002", "greeting_beep.wav", 2, 30000),
               Callee("+442079461003", "hello.wav", 1, 6000)]  # fmt: skip
    by_number = {c.number: c for c in callees}
    plays = {}
    for c in callees:
        pcm, rate = read_wav(str(ANSWERS / c.fixture))
        assert rate == 8000
        plays[c.number] = to_ulaw(pcm)
    config = AgentConfig.from_dict({"outbound": {"detect": True, "voicemail_wav": message_path}}, base_dir=tmp_path)
    agent = Agent(model="tiny-random", device="cpu", router=False, record_dir=tmp_path / "rec", seed=0,
                  max_calls=3, config=config)  # fmt: skip
    inner = agent_call_handler(agent)

    async def answered(call) -> None:  # the callee's recording starts as the call is answered
        callee = by_number[call.info.called]
        drain(callee.sock)  # nothing of an earlier call to this number is taken for this one's
        peer = RtpPeer(sock=callee.sock)
        callee.peers.append(peer)
        peer.start(("127.0.0.1", call.media.port), plays[callee.number])

        async def stop_at_end() -> None:  # before the number can be dialled again (the socket is the number's)
            await call.ended.wait()
            peer._task.cancel()
            await asyncio.gather(peer._task, return_exceptions=True)

        stopper = asyncio.ensure_future(stop_at_end())
        try:
            await inner(call)
        finally:
            await stopper

    sipp = []
    for c in callees:
        path = scenario("callee_greets", tmp_path, MEDIA_PORT=c.sock.getsockname()[1], TALK_MS=c.talk_ms)
        path = path.rename(tmp_path / f"greets-{c.number[1:]}.xml")
        sipp.append(asyncio.create_task(run_sipp("", tmp_path, "-sf", str(path), "-m", str(c.calls),
                                                 port=c.sip_port, timeout_s=300, name=f"callee-{c.number[1:]}")))
    store = await open_store(store_target, clock=Clock(offset_s=MONDAY_NOON_UTC - time.time()))
    cfg = CampaignConfig(max_concurrent=3, calls_per_minute=10000, reserve_inbound=0, max_attempts=2,
                         ring_timeout_s=10.0, poll_s=0.1, retry={"voicemail_left": RetryRule(delay_s=1.0)})
    runner = None
    try:
        for c in callees:
            await udp_bound(c.sip_port)
        async with agent, endpoint_on_loopback(answered, max_calls=3) as ep:
            agent.sip_endpoint = ep
            ep.shared = agent.admission
            csv_text = "to,name\n" + "".join(f"{c.uri},{c.fixture}\n" for c in callees)
            await create_campaign(store, cfg, "machines", parse_contacts(csv_text), {})
            runner = CampaignRunner(store, AgentDialer(agent), cfg, free_slots=lambda: dial_slots(agent))
            runner.start()
            handle = CampaignHandle(store, "machines")
            deadline = asyncio.get_running_loop().time() + 300  # ~20 s here; generous for a loaded CI box
            while (status := await handle.status())["state"] != "done":
                assert asyncio.get_running_loop().time() < deadline, status
                await asyncio.sleep(0.2)
            await runner.stop()
            runner = None
            exported = {row["to"]: row for row in csv.DictReader(io.StringIO(await handle.export()))}
            async with store.transaction() as tx:
                attempts = await tx.fetchall(
                    "SELECT c.to_number AS number, a.n, a.outcome, a.started_at, a.ended_at, a.call_id FROM attempts a "
                    "JOIN contacts c ON c.id = a.contact_id ORDER BY a.started_at")  # fmt: skip
            # each box tried exactly as `voicemail_left` with max_attempts 2 says; the person once (`human`: final)
            assert status["counts"] == {"voicemail_left": 2, "human": 1}, (status, attempts)
            results = await asyncio.wait_for(asyncio.gather(*sipp), 120)
            await wait_for(lambda: len(list((tmp_path / "rec").glob("*.json"))) >= 5, timeout_s=60,
                           what="the five calls' records")  # fmt: skip
            await wait_for(lambda: not ep.calls and not ep.ports._allocated, timeout_s=60, what="calls to close")
            await assert_nothing_held(agent, ep, 3)
    finally:
        if runner is not None:
            await runner.stop()
        await cancel_all(sipp)
        for c in callees:
            for peer in c.peers:
                if peer._task is not None:
                    peer._task.cancel()
            c.sock.close()
        await store.close()

    assert status["attempts"] == 5
    assert "voicemail_left 2" in status_line(status) and "human 1" in status_line(status)
    vm1, vm2, person = (c.uri for c in callees)
    for uri in (vm1, vm2):
        assert exported[uri]["attempts"] == "2" and exported[uri]["outcome"] == "voicemail_left", exported[uri]
        tries = [a for a in attempts if a["number"] == uri]
        assert [(a["n"], a["outcome"]) for a in tries] == [(1, "voicemail_left"), (2, "voicemail_left")], tries
        assert tries[1]["started_at"] - tries[0]["ended_at"] >= 1.0 - 0.05  # the rule's delay (no jitter)
    assert exported[person]["attempts"] == "1" and exported[person]["outcome"] == "human", exported[person]
    assert [a["outcome"] for a in attempts if a["number"] == person] == ["human"]

    # each attempt's call record says the same
    for a in attempts:
        record = json.loads((tmp_path / "rec" / f"{a['call_id'].replace('@', '_')}.json").read_text())
        verdict = record["meta"]["answer"]["verdict"]
        if a["number"] == person:
            assert verdict == "human", record["meta"]["answer"]
        else:
            assert record["meta"]["outcome"] == "voicemail_left" and verdict in ("voicemail", "beep"), record["meta"]

    # what each callee heard: the boxes nothing audible before the beep, then the message; the person the agent
    beep = LABELS["greeting_beep.wav"]["beep_at_s"]
    beep_end = beep + LABELS["greeting_beep.wav"]["extra"]["beep_s"]
    figures = []
    for c in callees[:2]:
        assert len(c.peers) == 2, c
        for peer in c.peers:
            first = peer.first_sound_s()
            assert first is not None and first > beep_end - 0.05, (c.number, first, beep_end)
            heard = peer.heard(beep)
            assert len(heard) >= len(message_pcm) * 0.9, (c.number, len(heard), len(message_pcm))
            score = _match(heard, message_pcm)
            assert score > 0.7, (c.number, score)  # the message itself, not the model's own audio
            figures.append(f"{first - beep_end:.2f} s after the beep (match {score:.2f})")
    [talk] = callees[2].peers
    assert talk.first_sound_s() is not None  # the gate opened: the agent's audio reached the person
    for c, got in zip(callees, results, strict=True):
        assert got.count("Successful call") == c.calls, got.output + got.errors
    print(f"voicemail campaign: messages reached the boxes {', '.join(figures)}; the person heard the agent "
          f"{talk.first_sound_s():.2f} s after answering")
