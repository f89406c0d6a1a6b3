"""One call's answer detection wired to its audio: the output gate, the verdict's consequences, the
voicemail drop and the screening reply.

`DuetaSpanService` (its `answer` attribute) hands the caller's audio to `AnswerGate.hear(pcm)` as it arrives
(before levelling, so the detector hears the line's own levels) and every engine tick to `tick(out)` before
anything else sees it. The gate feeds the audio to an `AnswerDetector` and, while the verdict is open,
returns the tick with the agent's frame silenced (no audio, no words): the model runs and listens,
nothing it says is sent or recorded as said (and the agent's wiring holds its own agent stream at silence in
the engine meanwhile: `duetaspan.agent.answer.hold_while_gated`). Then, by verdict:

| verdict | what happens |
|---|---|
| `human`, `silence` | un-gated at once: the next tick's audio is the agent's. After the audio's `human` the detector listens on for `recheck_s` (`DetectTuning`): a beep, or a greeting reading on past its first sentence, revises it, and the call is gated again and goes on as below |
| none by `timeout_s` | as `human` (`source: "timeout"`) |
| `voicemail` | stays gated, waits for the beep (at most `voicemail_wait_s`, or the greeting's end plus 2 s of quiet), then plays the message (`message_pcm`) and ends the call: `voicemail_left` with its length; `voicemail_no_message` without a message. Never before the beep when one comes |
| `beep` | the message starts right after the tone ends |
| `screening` | once the screener's question has ended (`QUIET_AFTER_QUESTION_S` of quiet, at most `QUESTION_MAX_S`), plays `screening_pcm` once (who is calling and why), then listens again for the person (a `human` verdict un-gates; quiet is no person yet) up to `screening_wait_s`: `screening_rejected` |
| `ivr` | stays gated and listens again (menus, hold music) until a person answers or `ivr_wait_s` passes: `ivr_dead_end`; with a `navigator` (the call's goal), presses keys toward it: `ivr_loop` when it goes round in circles |
| `fax` | ends the call: `fax` |

With `transcribe` (the agent's ASR), the first verdict gets a second opinion from the transcript of the first
seconds (`duetaspan.outbound.phrases`): "leave a message" after an audio `human` closes the gate again and the
call goes on as a voicemail; "press one" / "state your name" turn a `voicemail` into `ivr` / `screening`.
And a second listen: when, after the audio's `human`, the line speaks again within `recheck_s` (a person
answering the agent, or a menu's next sentence after a pause a person's "hello?" would make), everything
heard up to that utterance's end (at most `SECOND_LISTEN_S`) is transcribed once, and a menu's or greeting's
phrase that a person would not say ("press one", "after the tone": `phrases.later_verdict`) gates the call
again as that machine.

In `ivr`, the detector starts listening afresh when the menu's sound ends (at most `RELISTEN_MAX_S` into it),
not mid-sentence, so a long menu's last words are not taken for a person's "hello?". With a `navigator`
(`duetaspan.outbound.ivr.MenuNavigator`, `agent.dial(..., goal=...)`) and `transcribe`, the menu heard since
the last key press (the latest `MENU_MAX_S`) is transcribed once the line has been quiet `MENU_PAUSE_S` after
it, and the navigator asks the router's LLM for keys toward the goal (its own policy path); each press
restarts the `ivr_wait_s` clock; the same menu `LOOP_REPEATS` times after pressing, or a key asked for past
`max_presses`, ends the call: `ivr_loop`. Its decisions go to `press_listeners` and the summary's `ivr`.

Every verdict goes to `listeners` (the service's `on_answer` handler, the record, the trace, `/metrics`);
`end(reason, outcome)` is how the gate ends the call (the call's `end_call` action).

Example:
    >>> gate = AnswerGate(timeout_s=4.0)
    >>> gate.gated
    True
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from duetaspan.outbound.detector import AnswerDetector
from duetaspan.outbound.ivr import LOOP_REPEATS, MENU_MAX_S, MENU_PAUSE_S, PressLimit
from duetaspan.outbound.phrases import later_opinion, second_opinion
from duetaspan.outbound.verdicts import DetectTuning, Verdict

log = logging.getLogger("duetaspan.outbound")

RATE = 24_000  # the pipeline's rate: `TickOutput.caller_pcm` and the agent's frames
QUIET_AFTER_GREETING_S = 2.0
QUIET_AFTER_QUESTION_S = 1.0  # `screening`: the reply starts once the screener's question ended this long ago
QUESTION_MAX_S = 10.0  # ... or this long after the verdict at most
SECOND_OPINION_S = 4.0  # the first seconds of the call the second opinion transcribes
SECOND_LISTEN_S = 12.0  # ... and the second listen at most (a first verdict by ~4 s, then `recheck_s`)
RELISTEN_MAX_S = 10.0  # in `ivr`, listen afresh when the sound ends, or this long after the verdict at most


class AnswerGate:
    """See the module docstring."""

    def __init__(
        self,
        *,
        timeout_s: float = 4.0,
        tuning: DetectTuning | None = None,
        message_pcm: np.ndarray | None = None,
        screening_pcm: np.ndarray | None = None,
        voicemail_wait_s: float = 30.0,
        screening_wait_s: float = 20.0,
        ivr_wait_s: float = 60.0,
        end: Callable[[str, str], object] | None = None,
        transcribe: Callable[[np.ndarray, int], Awaitable[str]] | None = None,
        spawn: Callable[[Awaitable[Any]], object] | None = None,
        navigator: Any = None,
        judge: Any = None,
    ) -> None:
        self.tuning = tuning
        self.timeout_s = timeout_s
        self.detector = AnswerDetector(RATE, tuning)
        self.message_pcm, self.screening_pcm = message_pcm, screening_pcm
        self.voicemail_wait_s, self.screening_wait_s, self.ivr_wait_s = voicemail_wait_s, screening_wait_s, ivr_wait_s
        self.end = end or (lambda reason, outcome: None)
        self.listeners: list[Callable[[Verdict], object]] = []
        self.gated = True
        self.verdict: Verdict | None = None  # the verdict that decided the call's course
        self.verdicts: list[Verdict] = []
        self.outcome: str | None = None  # voicemail_left, voicemail_no_message, fax, ivr_dead_end, screening_rejected
        self.message_s = 0.0
        self.t = 0.0
        self._offset = 0.0  # call time at which the current detector started listening
        self._state = "detecting"
        self._since = 0.0
        self._playing: np.ndarray | None = None
        self._play_pos = 0
        self._after_play = ""
        self.ungated_at: float | None = None
        self.transcribe, self._spawn = transcribe, spawn or (lambda aw: asyncio.ensure_future(aw))
        self._first_audio: list[np.ndarray] = []  # the first seconds heard, for the second opinion and listen
        self._first_n = 0
        self._listened = False  # the second listen is spawned at most once
        self.navigator = navigator  # a `MenuNavigator` (the call's goal), or None: `ivr` only waits
        self.judge = judge  # an `AnswerJudge` (`duetaspan.outbound.judge`): the LLM when no phrase matched
        self.press_listeners: list[Callable[[Any], object]] = []
        self._menu_audio: list[np.ndarray] = []  # heard since the last key press (the latest MENU_MAX_S)
        self._menu_n = 0
        self._relisten_at: float | None = None  # `ivr`: listen afresh once the sound heard now ends
        self._menu_mark = 0.0  # call time the latest sound heard in `ivr` ended
        self._menu_done = 0.0  # the mark the navigator last decided on
        self._asking = False

    # ------------------------------------------------------------------------------------------------
    def hear(self, pcm: np.ndarray) -> None:
        """The caller's audio at the pipeline's rate as it arrives, before levelling (a line's own levels)."""
        if self.transcribe is not None and self._first_n < SECOND_LISTEN_S * RATE:
            self._first_audio.append(np.asarray(pcm, dtype=np.float32))
            self._first_n += len(pcm)
        if self._state == "done" or (self._state == "open" and not self._rechecking()):
            return
        if self.navigator is not None and self.transcribe is not None:
            self._keep_menu(np.asarray(pcm, dtype=np.float32))
        for v in self.detector.push(pcm):
            if v.verdict == "silence" and self._state in ("screening_wait", "ivr"):  # no person yet: a screener or
                # a menu waiting quietly (for a key) is not a person who picked up
                self._fresh_detector(self._offset + v.decided_at_s)
                break
            self._heard(dataclasses.replace(v, decided_at_s=v.decided_at_s + self._offset))
        if self._listen_due():
            assert self.verdict is not None
            self._listened = True
            self._spawn(self._second_listen(self.verdict, self._first_n))
        if self._relisten_at is not None and self._state == "ivr":
            sound_over = self.detector._seg_start is None
            if sound_over or self._offset + self.detector.t - self._relisten_at >= RELISTEN_MAX_S:
                heard, at = self.detector.utterances, self._offset + self.detector.t
                self._relisten_at, ended = None, self._offset + heard[-1][1] if sound_over and heard else at
                self._fresh_detector(at)
                self._menu_mark = max(self._menu_mark, ended)

    def _keep_menu(self, pcm: np.ndarray) -> None:
        self._menu_audio.append(pcm)
        self._menu_n += len(pcm)
        while len(self._menu_audio) > 1 and self._menu_n - len(self._menu_audio[0]) >= MENU_MAX_S * RATE:
            self._menu_n -= len(self._menu_audio.pop(0))

    def tick(self, out: Any) -> Any:
        """The tick as the rest of the service should see it (see the module docstring)."""
        self.t = max(self.t, self._offset + self.detector.t, float(out.t) + len(out.caller_pcm) / RATE)
        if self._state not in ("done", "open"):
            self._progress()
        if self._playing is not None:
            return self._play(out)
        if self.gated:
            return _silenced(out)
        return out

    def _progress(self) -> None:
        if self._state == "detecting" and self.verdict is None and self.t >= self.timeout_s:
            self._heard(Verdict("human", 0.5, self.t, source="timeout",
                                reason=f"no verdict in {self.timeout_s:g} s: proceeding as a person"))  # fmt: skip
        elif self._state == "voicemail":
            ended = bool(self.detector.utterances) and self._quiet(QUIET_AFTER_GREETING_S)
            if self.t - self._since >= self.voicemail_wait_s or ended:
                self._leave_message("no beep: the greeting ended")
        elif self._state == "screening":  # the reply once the screener's question has ended
            if self._quiet(QUIET_AFTER_QUESTION_S) or self.t - self._since >= QUESTION_MAX_S:
                self._reply()
        elif self._state == "screening_wait" and self.t - self._since >= self.screening_wait_s:
            self._finish("screening_rejected", "no person after the screening reply")
        elif self._state == "ivr" and self.t - self._since >= self.ivr_wait_s:
            self._finish("ivr_dead_end", f"no person after {self.ivr_wait_s:g} s of menus or hold")
        elif self._state == "ivr" and self._menu_due():
            self._menu_done, self._asking = self._menu_mark, True
            self._spawn(self._navigate())

    def _quiet(self, s: float) -> bool:
        """No sound now, and none for `s` (since the last utterance ended, or since listening began)."""
        heard = self.detector.utterances
        return self.detector._seg_start is None and self.t - self._offset - (heard[-1][1] if heard else 0.0) >= s

    def _menu_due(self) -> bool:
        """A menu to decide on: navigating, nothing in flight, a sound ended since the last decision and the
        line quiet `MENU_PAUSE_S` since."""
        if self.navigator is None or self.transcribe is None or self._asking or self._relisten_at is not None:
            return False
        d = self.detector
        if d._seg_start is not None:
            return False
        if d.utterances:
            self._menu_mark = max(self._menu_mark, self._offset + d.utterances[-1][1])
        return self._menu_mark > self._menu_done and self.t - self._menu_mark >= MENU_PAUSE_S

    async def _navigate(self) -> None:
        """Transcribe the menu since the last press and let the navigator press toward the goal; whatever
        fails leaves the call waiting (logged)."""
        nav, transcribe = self.navigator, self.transcribe
        assert nav is not None and transcribe is not None
        try:
            if not self._menu_audio:
                return
            try:
                text = await transcribe(np.concatenate(self._menu_audio), RATE)
            except Exception as exc:
                log.warning("ivr: the menu's ASR failed (%s); waiting", exc)
                return
            menu = " ".join(str(text or "").split())
            if not menu or self._state != "ivr":
                return
            if nav.loop_heard(menu):
                self._finish("ivr_loop", f"the same menu came back {LOOP_REPEATS} times after pressing "
                                         f"toward {nav.goal!r}")  # fmt: skip
                return
            try:
                decision = await nav.decide(menu, state=lambda: self._state, at=lambda: self.t)
            except PressLimit as exc:
                if self._state == "ivr":
                    self._finish("ivr_loop", str(exc))
                return
            if decision is None:
                return
            for listener in self.press_listeners:
                try:
                    listener(decision)
                except Exception:
                    log.exception("ivr press listener failed")
            if decision.allowed:
                self._menu_audio, self._menu_n = [], 0
                self._since = self.t  # a press is progress: the dead-end clock starts again
        except Exception:  # navigation is best effort: the call goes on waiting
            log.exception("ivr: navigating the menu failed; waiting")
        finally:
            self._asking = False

    def _heard(self, v: Verdict) -> None:
        self.verdicts.append(v)
        for listener in self.listeners:
            try:
                listener(v)
            except Exception:
                log.exception("answer verdict listener failed")
        state = self._state
        if state == "detecting" and self.transcribe is not None and v.verdict in ("human", "voicemail"):
            self._spawn(self._second_opinion(v, min(self._first_n, int(SECOND_OPINION_S * RATE))))
        if v.verdict in ("human", "silence") and state in ("detecting", "screening_wait", "ivr"):
            self.verdict = self.verdict if state != "detecting" else v
            self._open(v)
        elif state == "detecting":
            self.verdict = v
            self._machine(v)
        elif state == "voicemail" and v.verdict == "beep":
            self._leave_message(f"after the beep at {v.beep_at_s or 0:.2f} s")
        elif state in ("screening_wait", "ivr") and v.verdict in ("voicemail", "ivr", "beep"):
            self._listen_again(state)
        elif state == "open" and v.verdict in ("voicemail", "beep"):  # the detector revised its `human`
            log.info("answer: human -> %s at %.2f s (%s): gated again", v.verdict, v.decided_at_s, v.reason)
            self.verdict, self.gated = v, True
            self._machine(v)

    def _first(self, n: int) -> np.ndarray:
        """The first `n` samples heard."""
        return np.concatenate(self._first_audio)[:n] if self._first_audio else np.zeros(0, dtype=np.float32)

    async def _second_opinion(self, v: Verdict, n: int) -> None:
        """The transcript of the first words (the first `n` samples: up to the verdict, at most
        `SECOND_OPINION_S`) weighs in (`duetaspan.outbound.phrases`): a machine phrase after an audio `human`
        closes the gate again and handles the machine; `ivr`/`screening` refine a `voicemail`. With a `judge` and
        no phrase heard, the router's LLM weighs in the same way (`duetaspan.outbound.judge`)."""
        assert self.transcribe is not None
        try:
            text = await self.transcribe(self._first(n), RATE)
        except Exception as exc:  # the ASR is a second opinion: the audio's verdict stands without it
            log.warning("answer: the second opinion's ASR failed (%s); keeping %s", exc, v.verdict)
            return
        revised = second_opinion(v, text, at_s=self.t)
        if self.judge is not None and self.judge.wanted(v, text) and self.verdict is v and self._state != "done":
            revised = await self.judge.weigh(revised, text, at=lambda: self.t)  # never raises: `revised` on failure
        if revised.verdict == v.verdict or self._state in ("done", "playing") or self.verdict is not v:
            return
        self._overturned(v, revised)

    def _listen_due(self) -> bool:
        """The second listen is due: open on the audio's `human` (not on a person after a menu or a screener),
        still rechecking, never listened yet, and an utterance that started after the verdict has ended."""
        v = self.verdict
        if self.transcribe is None or self._listened or self._state != "open" or v is None or not self._rechecking():
            return False
        return any(start > v.decided_at_s - self._offset for start, _ in self.detector.utterances)

    async def _second_listen(self, v: Verdict, n: int) -> None:
        """Everything heard up to the line's next utterance after the audio's `human` (the first `n` samples),
        transcribed once: a menu's or greeting's phrase that a person would not say (`phrases.later_verdict`)
        gates the call again as that machine."""
        assert self.transcribe is not None
        try:
            text = await self.transcribe(self._first(n), RATE)
        except Exception as exc:  # best effort, as the second opinion
            log.warning("answer: the second listen's ASR failed (%s); keeping %s", exc, v.verdict)
            return
        revised = later_opinion(v, text, at_s=self.t)
        if revised is None or self._state != "open" or self.verdict is not v:
            return
        self._overturned(v, revised)

    def _overturned(self, v: Verdict, revised: Verdict) -> None:
        self.verdicts.append(revised)
        for listener in self.listeners:
            try:
                listener(revised)
            except Exception:
                log.exception("answer verdict listener failed")
        log.info("answer: %s -> %s (%s)", v.verdict, revised.verdict, revised.reason)
        self.verdict, self.gated = revised, True
        self._machine(revised)

    def _machine(self, v: Verdict) -> None:
        if v.verdict == "fax":
            self._finish("fax", v.reason)
        elif v.verdict == "beep":
            self._leave_message(f"after the beep at {v.beep_at_s or 0:.2f} s")
        elif v.verdict == "voicemail":
            self._state, self._since = "voicemail", self.t
        elif v.verdict == "screening":  # the reply waits for the question's end (`_progress`)
            self._state, self._since = "screening", self.t
        else:  # ivr: menus and hold music; wait for a person
            self._listen_again("ivr")

    def _reply(self) -> None:
        if self.screening_pcm is not None and len(self.screening_pcm):
            self._start_playing(self.screening_pcm, "screening_wait")
        else:
            self._listen_again("screening_wait")

    def _rechecking(self) -> bool:
        """Open on the audio's `human` and still within its `recheck_s`: the detector listens on for a beep or a
        greeting reading on (`duetaspan.outbound.detector`), which gate the call again."""
        v, heard = self.verdict, self.detector.verdict
        return (v is not None and v.verdict == "human" and v.source == "audio" and heard is not None
                and heard.verdict == "human" and self.t - v.decided_at_s <= self.detector.tuning.recheck_s)  # fmt: skip

    def _open(self, v: Verdict) -> None:
        self.gated = False
        self._state = "open"
        self.ungated_at = self.t
        log.info("answer: %s at %.2f s (%s): the agent speaks", v.verdict, v.decided_at_s, v.reason)

    def _listen_again(self, state: str) -> None:
        if self._state != state:
            self._since = self.t
        self._state = state
        if state == "ivr" and self.detector._seg_start is not None:  # mid-menu: afresh once the sound ends
            self._relisten_at = self._relisten_at if self._relisten_at is not None else self.t
            return
        self._fresh_detector(self.t)
        if state == "ivr":
            self._menu_mark = max(self._menu_mark, self.t)

    def _fresh_detector(self, at: float) -> None:
        """Listen afresh from call time `at`: a new detector (its time, sounds and verdict), on the line's noise
        floor as heard so far (a floor learnt anew took a concealed frame, which a loaded RTP playout inserts,
        for the line's silence and the line's own noise for speech: a person's hello then ran on into it)."""
        self.detector = AnswerDetector(RATE, self.tuning).same_line(self.detector)
        self._offset = at

    def _leave_message(self, why: str) -> None:
        if self.message_pcm is None or not len(self.message_pcm):
            self._finish("voicemail_no_message", f"voicemail ({why}); no message configured")
            return
        log.info("answer: leaving the voicemail message (%.1f s) %s", len(self.message_pcm) / RATE, why)
        self.message_s = len(self.message_pcm) / RATE
        self._start_playing(self.message_pcm, "voicemail_left")

    def _start_playing(self, pcm: np.ndarray, then: str) -> None:
        self._playing, self._play_pos, self._after_play = np.asarray(pcm, dtype=np.float32), 0, then
        self._state = "playing"

    def _play(self, out: Any) -> Any:
        assert self._playing is not None
        n = len(out.caller_pcm)
        chunk = self._playing[self._play_pos : self._play_pos + n]
        self._play_pos += n
        if self._play_pos >= len(self._playing):
            self._playing, then = None, self._after_play
            if then == "voicemail_left":
                self._finish("voicemail_left", f"left a {self.message_s:.1f} s message")
            else:
                self._listen_again(then)
        frame = np.zeros(n, dtype=np.float32)
        frame[: len(chunk)] = chunk
        return dataclasses.replace(out, result=dataclasses.replace(out.result, pcm=frame, silent=False, text=""))

    def _finish(self, outcome: str, reason: str) -> None:
        self.outcome, self._state = outcome, "done"
        log.info("answer: ending the call: %s (%s)", outcome, reason)
        try:
            self.end(reason, outcome)
        except Exception:
            log.exception("ending the call after %s failed", outcome)

    def call_outcome(self) -> str | None:
        """What the call came to, as a campaign attempt's outcome (`[campaign.retry]` keys): `outcome` when the
        gate ended the call (`voicemail_left`, `voicemail_no_message`, ...); `human` once the gate opened for a
        person (or silence, or no verdict in time); `voicemail_no_message` when a machine answered (a `human`
        revised to one included) and the call ended before the whole message was left (the greeting hung up);
        None when nothing was decided."""
        if self.outcome is not None:
            return self.outcome
        if self.verdict is not None and self.verdict.verdict in ("voicemail", "beep"):  # a `human` revised too
            return "voicemail_no_message"
        if self.ungated_at is not None:
            return "human"
        return None

    def summary(self) -> dict[str, Any]:
        """The call record's `answer` section."""
        v = self.verdict
        return {"verdict": v.verdict if v else None, "confidence": round(v.confidence, 3) if v else None,
                "decided_at_s": round(v.decided_at_s, 3) if v else None, "source": v.source if v else None,
                "ungated_at_s": None if self.ungated_at is None else round(self.ungated_at, 3),
                "outcome": self.outcome, "message_s": round(self.message_s, 3) if self.message_s else None,
                "beep_at_s": next((x.beep_at_s for x in self.verdicts if x.beep_at_s is not None), None),
                "verdicts": [x.as_json() for x in self.verdicts],
                "ivr": None if self.navigator is None else {
                    "goal": self.navigator.goal, "presses": self.navigator.presses,
                    "decisions": [d.as_json() for d in self.navigator.decisions]}}  # fmt: skip


def _silenced(out: Any) -> Any:
    r = out.result
    return dataclasses.replace(out, result=dataclasses.replace(r, pcm=np.zeros_like(r.pcm), silent=True, text=""))


__all__ = ["AnswerGate"]
