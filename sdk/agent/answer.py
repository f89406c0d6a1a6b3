"""A call's answer detection, as the agent wires it: whether the call gets an `AnswerGate`
(`[outbound] detect` for calls the agent places, `detect_inbound` for the others, `agent.dial(...,
detect=...)` per call), its messages (the voicemail wav, or text through `[outbound] tts_command`, rendered off
the event loop as the call starts), and where its verdicts go: the service's `on_answer` handler, the call's
record (`answer` events, `meta.answer`), the observer (`/metrics`, the trace), and the end of the call. While
the gate is closed, the model's own agent stream is also held at silence in the engine (`hold_while_gated`).

Example:
    >>> # gate = attach_answer_gate(agent, call_info, service, context, recorder)   # None: not detected
"""

from __future__ import annotations

import asyncio
import logging
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the gate (its detector needs scipy) loads only when a call is detected
    from duetaspan.outbound.gate import AnswerGate

log = logging.getLogger("duetaspan.outbound")


def wants_detection(config: Any, params: dict[str, Any]) -> bool:
    """Per call: `answer_detect` "1"/"0" (from `agent.dial(detect=...)`), else `[outbound]` by direction."""
    flag = str(params.get("answer_detect", ""))
    if flag in ("0", "1"):
        return flag == "1"
    outbound = str(params.get("direction", "")).startswith("outbound")
    return bool(config.outbound.detect if outbound else config.outbound.detect_inbound)


def render(text: str, command: list[str] | str, timeout_s: float = 60.0) -> np.ndarray:
    """`text` spoken by the TTS command (`{text}`, `{out}` replaced), as float32 at the pipeline's rate."""
    args = shlex.split(command) if isinstance(command, str) else list(command)
    with tempfile.TemporaryDirectory(prefix="duetaspan-tts-") as tmp:
        out = Path(tmp) / "say.wav"
        argv = [a.replace("{out}", str(out)).replace("{text}", text) for a in args]
        done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"[outbound] tts_command {argv[0]!r} exited {done.returncode}: "
                               f"{done.stderr.decode(errors='replace').strip()[-300:]}")  # fmt: skip
        return load_message(out)


def load_message(path: str | Path) -> np.ndarray:
    """A wav message at the pipeline's rate, mono (any rate in: espeak-ng, the default `tts_command`, writes
    22.05 kHz, which the detector's own reader refuses)."""
    from duetaspan.model.audio import read_wav, to_model_rate

    pcm, rate = read_wav(path)
    return to_model_rate(pcm, rate)


def attach_answer_gate(agent: Any, call: Any, service: Any, context: Any, recorder: Any) -> AnswerGate | None:
    """Give `service` its gate when the call is detected (see the module docstring); the agent's ASR, when
    it has one, gives the second opinion."""
    config = agent.config
    asr = (getattr(agent, "shared", None) or {}).get("asr")
    params = dict(getattr(call, "params", {}) or {})
    if not wants_detection(config, params):
        return None
    from duetaspan.outbound.gate import AnswerGate  # here: scipy loads with the first detected call

    o = config.outbound

    def end(reason: str, outcome: str) -> None:
        if recorder is not None:
            recorder.event("meta", outcome=outcome)
        if context is not None:
            context.request_action("end_call", reason=f"{outcome}: {reason}")

    transcribe = getattr(asr, "transcribe", None) if type(asr).__name__ != "NullASR" else None
    gate = AnswerGate(timeout_s=o.detect_timeout_s, voicemail_wait_s=o.voicemail_wait_s,
                      screening_wait_s=o.screening_wait_s, ivr_wait_s=o.ivr_wait_s, end=end,
                      transcribe=transcribe, spawn=service.spawn,
                      navigator=menu_navigator(agent, params, context, transcribe),
                      judge=answer_judge(agent, transcribe))  # fmt: skip
    hold = hold_while_gated(service, gate)

    def hear(pcm: np.ndarray) -> None:
        gate.hear(pcm)
        hold()  # a verdict from this audio un-gates the agent from the engine's next tick

    def tick(out: Any) -> Any:
        out = gate.tick(out)
        hold()  # a verdict at this tick (no verdict in time) un-gates it from the next
        return out

    service.caller_taps.append(hear)  # the line's own levels, before levelling
    service.tick_filters.insert(0, tick)  # gated: the agent's frame silenced, before any other filter
    service.answer = gate  # the call's gate, for handlers and tests (`service.answer.verdict`)

    def heard(verdict: Any) -> None:
        if recorder is not None:
            recorder.event("answer", **verdict.as_json())
        service.spawn(service.call_handler("on_answer", verdict))

    gate.listeners.append(heard)
    if recorder is not None:
        gate.press_listeners.append(lambda press: recorder.event("ivr_press", **press.as_json()))
    if recorder is not None:
        recorder.before_close.append(lambda: recorder.event("meta", answer=gate.summary()))
    _prepare_messages(gate, o, Path(getattr(config, "base_dir", ".")))
    return gate


def menu_navigator(agent: Any, params: dict[str, Any], context: Any, transcribe: Any) -> Any:
    """The call's `MenuNavigator` (`duetaspan.outbound.ivr`) when it has a goal (`ivr_goal`, from
    `agent.dial(..., goal=...)`): the router's LLM and side-effect policy, keys pressed by `send_dtmf` on the
    call's context. None without a goal; without an ASR or a router LLM the goal is logged and the menu only
    waited through."""
    goal = " ".join(str(params.get("ivr_goal") or "").split())
    if not goal:
        return None
    router = (getattr(agent, "shared", None) or {}).get("router")
    llm = getattr(router, "llm", None)
    if transcribe is None or llm is None or context is None:
        log.warning("goal %r: phone menus need the agent's ASR and router LLM; menus are only waited through", goal)
        return None
    from duetaspan.outbound.ivr import MenuNavigator, dtmf_press

    return MenuNavigator(goal, llm, dtmf_press(context), policy=getattr(router, "policy", None))


def answer_judge(agent: Any, transcribe: Any) -> Any:
    """The call's LLM second opinion (`duetaspan.outbound.judge.AnswerJudge`) with `[outbound] second_opinion =
    "llm"`: the router's LLM, its mode, `second_opinion_timeout_s`. None with "phrases" (the default); without
    an ASR or a router LLM it is logged (once) and the phrases decide alone."""
    o = agent.config.outbound
    if getattr(o, "second_opinion", "phrases") != "llm":
        return None
    router = (getattr(agent, "shared", None) or {}).get("router")
    llm = getattr(router, "llm", None)
    if transcribe is None or llm is None:
        if not _warned:
            _warned.append(True)
            log.warning('[outbound] second_opinion = "llm" needs the agent\'s ASR and router LLM; phrases only')
        return None
    from duetaspan.outbound.judge import AnswerJudge

    return AnswerJudge(llm, mode=str(getattr(router, "mode", "native")), timeout_s=o.second_opinion_timeout_s)


_warned: list[bool] = []  # the missing ASR or LLM is logged once per process


def hold_while_gated(service: Any, gate: Any) -> Callable[[], None]:
    """Hold the model's own agent stream at silence inside the engine while `gate` is gated: it listens, but
    nothing nobody hears goes into its context as said, and it is not mid-sentence when un-gated. Call the
    returned function after the gate hears or ticks: it releases the agent (or holds it again) from the
    engine's next tick. It starts held; a slot not open yet opens held (`service.agent_held`)."""

    def sync() -> None:
        if service.agent_held != gate.gated:
            service.agent_held = gate.gated
            if service.slot is not None:
                service.slot.hold_agent(gate.gated)

    sync()
    return sync


def _prepare_messages(gate: AnswerGate, o: Any, base: Path) -> None:
    jobs: list[tuple[str, Any]] = []
    if o.voicemail_wav is not None:
        path = o.voicemail_wav if Path(o.voicemail_wav).is_absolute() else base / o.voicemail_wav
        jobs.append(("message_pcm", lambda: load_message(path)))
    elif o.voicemail_text:
        jobs.append(("message_pcm", lambda: render(o.voicemail_text, o.tts_command)))
    if o.screening_reply:
        jobs.append(("screening_pcm", lambda: render(o.screening_reply, o.tts_command)))
    if not jobs:
        return
    loop = asyncio.get_running_loop()
    for name, job in jobs:

        def done(fut: asyncio.Future[np.ndarray], name: str = name) -> None:
            if fut.exception() is not None:
                log.error("answer detection: the %s could not be prepared: %s", name, fut.exception())
            else:
                setattr(gate, name, fut.result())

        loop.run_in_executor(None, job).add_done_callback(done)


__all__ = ["answer_judge", "attach_answer_gate", "hold_while_gated", "load_message", "menu_navigator", "render",
           "wants_detection"]  # fmt: skip
