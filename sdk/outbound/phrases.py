"""The second opinion: what the first words say, once an ASR has transcribed them.

Audio alone tells a person from a machine but not a voicemail greeting from a phone menu or a call screener,
and it takes a greeting's short first sentence ("This is Dana. Leave a message.") for a person. When an ASR
is configured, the detector's first utterance (or its first seconds of a long one) is transcribed and
`second_opinion(audio_verdict, transcript)` weighs the phrases:

| phrases (examples) | verdict |
|---|---|
| "press one", "for billing", "main menu", "para español", "please hold", "your call is important" | `ivr` |
| "state your name", "who is calling", "screening service", "record your name", "what this is regarding" | `screening` |
| "leave a message", "after the tone", "not available", "voicemail", "you've reached", "mailbox" | `voicemail` |

A machine phrase overturns an audio `human` (the reason says so); an audio machine verdict is refined to
`ivr` or `screening` by theirs; a transcript with no such phrase leaves the audio verdict as it was.

Example:
    >>> from duetaspan.outbound.verdicts import Verdict
    >>> second_opinion(Verdict("voicemail", 0.8, 2.6), "For billing, press one.", at_s=3.1).verdict
    'ivr'
    >>> second_opinion(Verdict("human", 0.7, 1.9), "This is Dana. Leave a message.", at_s=2.4).verdict
    'voicemail'
"""

from __future__ import annotations

import dataclasses
import re

from duetaspan.outbound.verdicts import Verdict

PHRASES: dict[str, tuple[str, ...]] = {
    "ivr": (r"\bpress (one|two|three|four|five|six|seven|eight|nine|zero|star|pound|\d)\b", r"\bfor \w+,? press\b",
            r"\bmain menu\b", r"\bpara espa[nñ]ol\b", r"\boprima\b", r"\bplease hold\b", r"\bstay on the line\b",
            r"\byour call is important\b", r"\bextension\b", r"\bdial it at any time\b"),
    "screening": (r"\bstate your name\b", r"\bwho is calling\b", r"\bwho's calling\b", r"\bscreening service\b",
                  r"\brecord your name\b", r"\bsay your name\b", r"\bwhat (this|it) is regarding\b",
                  r"\breason for calling\b", r"\bwhy you're calling\b", r"\bsee if this person is available\b"),
    "voicemail": (r"\bleave (me |us )?(a |your )?(detailed |short )?message\b", r"\bafter the (tone|beep)\b",
                  r"\bat the tone\b", r"\b(is|am|are|i'm|we're) not available\b", r"\bnot available\b",
                  r"\bvoice ?mail\b", r"\byou'?ve reached\b", r"\byou have reached\b", r"\bmailbox\b",
                  r"\bcan'?t (come to|take) the phone\b", r"\bcall you back\b", r"\bget back to you\b",
                  r"\bvoice message system\b", r"\bnumber you have dialed\b", r"\bperson you are calling\b"),
}  # fmt: skip
_COMPILED = {verdict: [re.compile(p, re.IGNORECASE) for p in pats] for verdict, pats in PHRASES.items()}
ORDER = ("screening", "ivr", "voicemail")  # "who is calling ... leave a message" is a screener first


def phrase_verdict(transcript: str) -> tuple[str, str] | None:
    """`(verdict, the phrase heard)` for the first machine phrase class that matches, else None."""
    text = " ".join(transcript.lower().replace("’", "'").split())
    for verdict in ORDER:
        for pattern in _COMPILED[verdict]:
            found = pattern.search(text)
            if found:
                return verdict, found.group(0)
    return None


def second_opinion(audio: Verdict, transcript: str, *, at_s: float) -> Verdict:
    """The verdict after the transcript's phrases (the module docstring); `at_s` is when the ASR answered."""
    found = phrase_verdict(transcript)
    if found is None or audio.verdict in ("fax", "silence", "beep"):
        return audio if audio.transcript else dataclasses.replace(audio, transcript=transcript)
    verdict, phrase = found
    if verdict == audio.verdict:
        return dataclasses.replace(audio, confidence=max(audio.confidence, 0.95), transcript=transcript,
                                   reason=f"{audio.reason}; the transcript agrees ({phrase!r})")  # fmt: skip
    how = "overturns" if audio.verdict == "human" else "refines"
    return Verdict(verdict, 0.9, at_s, source="asr", transcript=transcript,
                   reason=f"the transcript says {phrase!r} ({how} the audio's {audio.verdict})")  # fmt: skip


__all__ = ["ORDER", "PHRASES", "phrase_verdict", "second_opinion"]
