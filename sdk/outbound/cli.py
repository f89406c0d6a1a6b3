"""`duetaspan detect FILE.wav [FILE.wav ...] [--json]`: who answered, for recordings of the first seconds of
calls (any mono wav at 8, 16 or 24 kHz), each streamed through the answer detector in 20 ms pieces as a live
call would be; the duplex model is not loaded.

Relied-on contract (issue #33; keep it exactly): with `--json`, one JSON object per line and file, with
`file`, `verdict` (human, voicemail, beep, ivr, screening, silence, fax), `confidence` (0..1),
`decided_at_s` (seconds from the start of the file) and `beep_at_s` (null when no beep); more fields
(`reason`, `first_verdict`, `first_decided_at_s`, `beep_end_s`, `source`, `transcript`) may follow. Without
it, one line per file:

    greeting.wav: beep (0.90) at 4.42 s, beep at 4.04 s: a 0.37 s tone at 901 Hz

`verdict` is the verdict as the recording ends: a greeting's `voicemail` becomes `beep` when its record tone
comes, a `human` after which a beep comes is revised to `beep`, one after which the line reads on (a
greeting's next sentences: `duetaspan.outbound.detector`) to `voicemail`. A file that cannot be read gets an `error`
line (stderr without --json) and the exit status is 1.

`--asr MODEL` adds the second opinion a call gets with an ASR configured (`duetaspan.outbound.phrases`): when
the first verdict is `human` or `voicemail`, what was heard up to it (at most the first 4 s, as the call's gate
keeps) is transcribed by faster-whisper (`MODEL`: a size such as `tiny.en`, or a folder of CTranslate2
files; the `whisper` extra) and its phrases may overturn a `human` or refine a `voicemail` to `ivr` or
`screening`. The revised verdict's `decided_at_s` is the first verdict's plus the transcription's own time on
this machine; `source` is `asr` and `transcript` the text. After a `human` that stands, the second listen as
on a call: the first utterance that starts after it and ends within `recheck_s` is transcribed with all
before it, and a menu's or greeting's phrase a person would not say (`phrases.later_verdict`) overturns it.

Example:
    duetaspan detect tests/fixtures/answers/*.wav --json
    duetaspan detect call.wav --asr tiny.en
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy only when a file is classified: every command's start registers this parser
    import numpy as np

    from duetaspan.outbound.detector import AnswerDetector
    from duetaspan.outbound.verdicts import Verdict


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "detect",
        help="classify who answered (person, voicemail, beep, menu, screener, silence, fax) in call recordings",
        description="Classify recordings of the first seconds of calls (mono wav, 8/16/24 kHz) as if streamed "
        "in real time: human, voicemail, beep (with its time), ivr, screening, silence or fax.",
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE.wav")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.add_argument("--asr", metavar="MODEL", default=None,
                   help="a second opinion from the transcript of the first seconds, by faster-whisper (a size "
                   "such as tiny.en, or a folder of CTranslate2 files)")  # fmt: skip
    p.set_defaults(func=run)


Transcribe = Callable[["np.ndarray", int], str]  # (pcm, its rate) -> the text


def whisper_transcriber(model: str) -> Transcribe:
    """faster-whisper (`duetaspan.adapters.asr.whisper`) as a blocking `transcribe(pcm, rate) -> text`."""
    from duetaspan.adapters.asr.whisper import FasterWhisperClient

    client = FasterWhisperClient(model, device="cpu", language="en", timeout_s=60.0)
    client.load()  # a model that cannot load is an error before the first file, not one per file
    return lambda pcm, rate: str(asyncio.run(client.transcribe(pcm, rate)))


def with_second_opinion(det: AnswerDetector, pcm: np.ndarray, rate: int, transcribe: Transcribe) -> Verdict:
    """The final verdict once the transcript weighs in, as the call's gate has it (`duetaspan.outbound.gate`):
    only a first `human` or `voicemail` is asked about (what was heard up to it, at most `SECOND_OPINION_S`),
    and a beep heard after it keeps its own verdict. Then the second listen: after a first `human` that nothing
    revised, the first utterance that starts after it and has ended within `recheck_s` of it is transcribed with
    all before it (at most `SECOND_LISTEN_S`), and a phrase of `phrases.later_verdict` overturns the `human`,
    decided when the utterance's end was heard plus the transcription's time."""
    from duetaspan.outbound.gate import SECOND_LISTEN_S, SECOND_OPINION_S
    from duetaspan.outbound.phrases import later_opinion, second_opinion

    first, final = det.verdict, det.final
    assert first is not None and final is not None  # a classified recording always has a verdict
    if first.verdict not in ("human", "voicemail"):
        return final
    heard = pcm[: int(min(first.decided_at_s, SECOND_OPINION_S) * rate)]
    started = time.perf_counter()
    text = transcribe(heard, rate)
    revised = second_opinion(first, text, at_s=first.decided_at_s + time.perf_counter() - started)
    if final is not first:
        return final
    if first.verdict != "human" or revised.verdict != "human":
        return revised
    since, within = first.decided_at_s, det.tuning.recheck_s
    later = [ended for (start, _), ended in zip(det.utterances, det.ended_at, strict=True)
             if start > since and ended - since <= within]  # fmt: skip
    if not later:
        return revised
    started = time.perf_counter()
    more = transcribe(pcm[: int(min(later[0], SECOND_LISTEN_S) * rate)], rate)
    return later_opinion(first, more, at_s=later[0] + time.perf_counter() - started) or revised


def detect_file(path: Path, transcribe: Transcribe | None = None) -> dict[str, Any]:
    """The contract's fields (and the extras) for one file; raises ValueError / OSError when unreadable."""
    from duetaspan.outbound import classify, read_wav

    pcm, rate = read_wav(str(path))
    det = classify(pcm, rate)
    first, final = det.verdict, det.final
    assert first is not None and final is not None  # classify always ends with a verdict
    if transcribe is not None:
        final = with_second_opinion(det, pcm, rate, transcribe)
    beep = det.beep
    return {"file": str(path), "verdict": final.verdict, "confidence": round(final.confidence, 3),
            "decided_at_s": round(final.decided_at_s, 3),
            "beep_at_s": None if beep is None or beep.beep_at_s is None else round(beep.beep_at_s, 3),
            "beep_end_s": None if beep is None or beep.beep_end_s is None else round(beep.beep_end_s, 3),
            "first_verdict": first.verdict, "first_decided_at_s": round(first.decided_at_s, 3),
            "reason": final.reason, "source": final.source, "transcript": final.transcript}  # fmt: skip


def line(result: dict[str, Any]) -> str:
    beep = f", beep at {result['beep_at_s']:.2f} s" if result["beep_at_s"] is not None else ""
    return (f"{result['file']}: {result['verdict']} ({result['confidence']:.2f}) at {result['decided_at_s']:.2f} s"
            f"{beep}: {result['reason']}")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    status = 0
    transcribe = None
    if args.asr:
        from duetaspan.errors import ConfigError

        try:
            transcribe = whisper_transcriber(args.asr)
        except (ConfigError, ImportError) as exc:
            print(f"error: --asr {args.asr}: {exc}", file=sys.stderr, flush=True)
            return 2
    for path in args.files:
        try:
            result = detect_file(path, transcribe)
        except (OSError, ValueError, EOFError) as exc:  # wave.Error is an Exception: caught below
            result = {"file": str(path), "error": str(exc)}
        except Exception as exc:  # wave.Error (not a wav at all)
            result = {"file": str(path), "error": f"{type(exc).__name__}: {exc}"}
        if "error" in result:
            status = 1
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                print(f"{path}: error: {result['error']}", file=sys.stderr, flush=True)
            continue
        print(json.dumps(result) if args.json else line(result), flush=True)
    return status


__all__ = ["detect_file", "line", "register", "run"]
