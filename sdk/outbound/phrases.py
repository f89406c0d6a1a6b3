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
`ivr` or `screening` by theirs; a transcript with no such phrase leaves the audio verdict as it was. The
phrases allow for how a small Whisper mishears them on an 8 kHz line ("leave my message", "leave me a minute").

**The second listen.** After an audio `human`, the line may speak again while the agent talks: a person
answering it, or a menu or greeting whose first sentence ended in a person's pause ("Thank you for calling
Acme Bank." ... "For billing, press one."). `later_verdict(transcript)` weighs the transcript of everything
heard up to that next utterance's end with `AFTER_A_PERSON` only: the menu's and greeting's phrases a person
who picked up would not say to a caller ("press one", "after the tone", "you've reached", "leave a message"
but not "want to leave a message?"); not "not available", "call you back", "please hold" or any screener's
question ("who is calling?"), which a person may well say.

Example:
    >>> from duetaspan.outbound.verdicts import Verdict
    >>> second_opinion(Verdict("voicemail", 0.8, 2.6), "For billing, press one.", at_s=3.1).verdict
    'ivr'
    >>> second_opinion(Verdict("human", 0.7, 1.9), "This is Dana. Leave a message.", at_s=2.4).verdict
    'voicemail'
    >>> later_verdict("Hello? Yes, she's not available, do you want to leave a message?") is None
    True
    >>> later_verdict("Thank you for calling Acme Bank. For billing, press one.")
    ('ivr', 'press one')
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
    "voicemail": (r"\bleave (me |us )?(a |my |your )?(detailed |short )?message\b", r"\bleave (me |us )?(a|my) minute\b", r"\bafter the (tone|beep)\b",
                  r"\bat the tone\b", r"\b(is|am|are|i'm|we're) not available\b", r"\bnot available\b",
                  r"\bvoice ?mail\b", r"\byou'?ve reached\b", r"\byou have reached\b", r"\bmailbox\b",
                  r"\bcan'?t (come to|take) the phone\b", r"\bcall you back\b", r"\bget back to you\b",
                  r"\bvoice message system\b", r"\bnumber you have dialed\b", r"\bperson you are calling\b"),
}  # fmt: skip
# the second listen's phrases: what a menu or a greeting says and a person who picked up would not
AFTER_A_PERSON: dict[str, tuple[str, ...]] = {
    "ivr": (r"\bpress (one|two|three|four|five|six|seven|eight|nine|zero|star|pound|\d)\b", r"\bfor \w+,? press\b",
            r"\bmain menu\b", r"\bpara espa[nñ]ol\b", r"\boprima\b", r"\byour call is important\b",
            r"\bdial it at any time\b", r"\bif you know\b[^.?!]{0,40}\bextension\b"),
    "voicemail": (r"(?<!to )(?<!can )\bleave (me |us )?(a |my |your )?(detailed |short )?message\b",
                  r"\bleave (me |us )?(a|my) minute\b", r"\bafter the (tone|beep)\b", r"\bat the tone\b", r"\bvoice ?mail\b",
                  r"\byou'?ve reached\b", r"\byou have reached\b", r"\bmailbox\b", r"\bvoice message system\b",
                  r"\bnumber you have dialed\b", r"\bperson you are calling\b"),
}  # fmt: skip
_COMPILED = {verdict: [re.compile(p, re.IGNORECASE) for p in pats] for verdict, pats in PHRASES.items()}
_LATER = {verdict: [re.compile(p, re.IGNORECASE) for p in pats] for verdict, pats in AFTER_A_PERSON.items()}
ORDER = ("screening", "ivr", "voicemail")  # "who is calling ... leave a message" is a screener first


def _search(transcript: str, compiled: dict[str, list[re.Pattern[str]]]) -> tuple[str, str] | None:
    text = " ".join(transcript.lower().replace("’", "'").split())
    for verdict in ORDER:
        for pattern in compiled.get(verdict, ()):
            found = pattern.search(text)
            if found:
                return verdict, found.group(0)
    return None


def phrase_verdict(transcript: str) -> tuple[str, str] | None:
    """`(verdict, the phrase heard)` for the first machine phrase class that matches, else None."""
    return _search(transcript, _COMPILED)


def later_verdict(transcript: str) -> tuple[str, str] | None:
    """The second listen's `(verdict, phrase)`: only `AFTER_A_PERSON`'s phrases count (the module docstring)."""
    return _search(transcript, _LATER)


def later_opinion(audio: Verdict, transcript: str, *, at_s: float) -> Verdict | None:
    """The second listen's verdict overturning the audio's `human` (`source` asr, decided `at_s`), or None when
    `later_verdict` finds no phrase."""
    found = later_verdict(transcript)
    if found is None:
        return None
    verdict, phrase = found
    return Verdict(verdict, 0.85, at_s, source="asr", transcript=transcript,
                   reason=f"the line spoke again after the person's verdict and the transcript says {phrase!r} "
                   f"(overturns the audio's {audio.verdict})")  # fmt: skip


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


__all__ = ["AFTER_A_PERSON", "ORDER", "PHRASES", "later_opinion", "later_verdict", "phrase_verdict", "second_opinion"]
