"""`[outbound]`: who answered a call the agent placed (`duetaspan.outbound`, docs/outbound.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from duetaspan.config.base import _Section


class OutboundConfig(_Section):
    """Answer detection and what follows it.

    Attributes:
        detect: classify who answered every call the agent places (`agent.dial(..., detect=...)` overrides
            it per call); the agent's output is gated until the verdict.
        detect_inbound: classify inbound calls too.
        detect_timeout_s: no verdict by then: proceed as a person (un-gate).
        voicemail_wav: the message left after a voicemail's beep, a wav file (relative to agent.toml).
        voicemail_text: the message as text, spoken by `tts_command` (when no `voicemail_wav`).
        screening_reply: who is calling and why, spoken once to a call screener (by `tts_command`).
        tts_command: a command that writes a wav, `{text}` and `{out}` replaced (the shape of
            `duetaspan.testing`'s): e.g. `["espeak-ng", "-w", "{out}", "{text}"]`.
        voicemail_wait_s: the longest wait for the beep after a voicemail verdict.
        ivr_wait_s: the longest wait through menus and hold music for a person.
        screening_wait_s: the longest wait for the person after the screening reply.
        second_opinion: what weighs in on the audio's verdict once the agent's ASR has transcribed the first
            seconds: "phrases" (phrase rules: "leave a message", "press one", "state your name") or "llm"
            (the phrases, then, when none matched, the router's LLM classifies the transcript; docs/outbound.md).
        second_opinion_timeout_s: the router's LLM's time limit as second opinion (past it the verdict stands).
    """

    detect: bool = False
    detect_inbound: bool = False
    detect_timeout_s: float = Field(4.0, gt=0, le=30)
    voicemail_wav: Path | None = None
    voicemail_text: str | None = None
    screening_reply: str | None = None
    tts_command: list[str] | str = Field(default_factory=lambda: ["espeak-ng", "-s", "150", "-w", "{out}", "{text}"])
    voicemail_wait_s: float = Field(30.0, gt=0)
    ivr_wait_s: float = Field(60.0, gt=0)
    screening_wait_s: float = Field(20.0, gt=0)
    second_opinion: Literal["phrases", "llm"] = "phrases"
    second_opinion_timeout_s: float = Field(3.0, gt=0, le=30)


__all__ = ["OutboundConfig"]
