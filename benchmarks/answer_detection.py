"""Answer detection on the generated corpus (`benchmarks/answer_corpus.py`): accuracy per class, the
confusion between `human` and the machine verdicts both ways, decision times and the beep timing error.

Each file is streamed through `duetaspan.outbound.AnswerDetector` in 20 ms chunks as a live call would be
(`classify`). Figures printed:

- per class: how many got the expected kind of verdict (`human` for people; a machine verdict for
  greetings, carrier messages, menus, hold music and screeners; `fax`; `silence`), and the exact verdicts;
- human -> machine (people called machines: the agent would hang up on them) and machine -> human;
- a person's verdict time after their first words end (goal: within 1.0 s), a machine's from the answer
  (goal: within 3 s): median and P95;
- beeps: found / present, and |located - true| start error (goal: within 250 ms).

Example:
    python benchmarks/answer_detection.py                         # the tuning batch, generated in a temp dir
    python benchmarks/answer_detection.py --batch heldout         # checks the committed seed and hash first
    python benchmarks/answer_detection.py --batch heldout2        # the second round's held-out batch
    python benchmarks/answer_detection.py --batch heldout3        # the third round's held-out batch
    python benchmarks/answer_detection.py --batch heldout4        # the fourth round's held-out batch
    python benchmarks/answer_detection.py --batch heldout5        # the fifth round's held-out batch
    python benchmarks/answer_detection.py --batch heldout6        # the sixth round's held-out batch
    python benchmarks/answer_detection.py --batch heldout7        # the seventh round's held-out batch
    python benchmarks/answer_detection.py --batch heldout8        # the eighth round's held-out batch
    python benchmarks/answer_detection.py --batch heldout9        # the ninth round's held-out batch
    python benchmarks/answer_detection.py --batch heldout10       # the tenth round's held-out batch
    python benchmarks/answer_detection.py --batch heldout11       # the eleventh round's held-out batch
    python benchmarks/answer_detection.py --batch heldout12       # the twelfth round's held-out batch
    python benchmarks/answer_detection.py --asr tiny.en           # with the transcript's second opinion
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from answer_corpus import SEEDS, corpus_hash, generate

from duetaspan.outbound import MACHINE, classify, read_wav
from duetaspan.outbound.cli import Transcribe, whisper_transcriber, with_second_opinion


def _kind(verdict: str, expect: str = "") -> str:
    """What a verdict counts as: `fax` as itself where a fax is expected, else any machine verdict as machine."""
    if verdict == "fax" and expect == "fax":
        return "fax"
    return "machine" if verdict in MACHINE else verdict


def score(corpus: Path, transcribe: Transcribe | None = None) -> dict:
    """The figures of one batch; with `transcribe` (`--asr`), each file's final verdict after the transcript's
    second opinion, as a call with an ASR gets it (`duetaspan.outbound.cli.with_second_opinion`)."""
    items = json.loads((corpus / "manifest.json").read_text())
    rows = []
    for it in items:
        pcm, rate = read_wav(str(corpus / it["file"]))
        det = classify(pcm, rate)
        first, final = det.verdict, det.final
        assert first is not None and final is not None
        heard = ""
        if transcribe is not None:
            final = with_second_opinion(det, pcm, rate, transcribe)
            heard = final.transcript or ""
        # the first machine verdict: the audio's, or the transcript's when it overturned a first `human`
        machine_at = first.decided_at_s if _kind(first.verdict) == "machine" else None
        if machine_at is None and final.source == "asr" and _kind(final.verdict) == "machine":
            machine_at = final.decided_at_s
        # ... and the detector's own revision of a first `human` (a beep, a greeting reading on)
        revised_at = next((v.decided_at_s for v in det.history if _kind(v.verdict) == "machine"), None)
        rows.append({**it, "first": first.verdict, "final": final.verdict, "first_at": first.decided_at_s,
                     "final_at": final.decided_at_s, "machine_at": machine_at, "revised_at": revised_at if first.verdict == "human" else None, "by_asr": final.source == "asr", "heard": heard,
                     "found_beep": det.beep.beep_at_s if det.beep else None})  # fmt: skip
    by_class: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_class[r["kind"]].append(r)
    out: dict = {"files": len(rows), "classes": {}}
    for kind, rs in by_class.items():
        ok = sum(_kind(r["final"], r["expect"]) == r["expect"] for r in rs)
        out["classes"][kind] = {"n": len(rs), "correct": ok, "accuracy": round(ok / len(rs), 3),
                                "verdicts": dict(Counter(r["final"] for r in rs))}  # fmt: skip
    people = [r for r in rows if r["expect"] == "human"]
    machines = [r for r in rows if r["expect"] == "machine"]
    out["human_as_machine"] = sum(_kind(r["final"]) == "machine" for r in people)
    out["human_first_verdict_machine"] = sum(_kind(r["first"]) == "machine" for r in people)
    out["machine_as_human"] = sum(r["final"] == "human" for r in machines)
    out["machine_first_verdict_human"] = sum(r["first"] == "human" for r in machines)
    out["people"], out["machines"] = len(people), len(machines)
    human_t = [r["first_at"] - r["speech_end_s"] for r in people if r["first"] == "human"]
    machine_t = [r["first_at"] for r in machines if _kind(r["first"]) == "machine"]
    any_machine_t = [r["machine_at"] for r in machines if r["machine_at"] is not None]
    revised_t = [r["revised_at"] for r in machines if r["revised_at"] is not None]
    out["machine_revised_from_human"] = len(revised_t)
    out["human_revised_to_machine"] = sum(r["revised_at"] is not None for r in people)
    series = [("human_after_words_s", human_t), ("machine_s", machine_t),
              ("machine_any_s", machine_t + revised_t)]
    if transcribe is not None:
        out["asr_revised"] = sum(r["by_asr"] for r in rows)
        series.append(("machine_with_asr_s", any_machine_t))
    for name, ts in series:
        if ts:
            out[name] = {"median": round(float(np.median(ts)), 3), "p95": round(float(np.percentile(ts, 95)), 3),
                         "max": round(float(np.max(ts)), 3)}  # fmt: skip
    beeps = [r for r in rows if r["beep_at_s"] is not None]
    errors = [abs(r["found_beep"] - r["beep_at_s"]) for r in beeps if r["found_beep"] is not None]
    out["beeps"] = {"present": len(beeps), "found": len(errors),
                    "false": sum(r["found_beep"] is not None for r in rows if r["beep_at_s"] is None)}  # fmt: skip
    if errors:
        out["beeps"] |= {"error_median_ms": round(1000 * float(np.median(errors))),
                         "error_max_ms": round(1000 * float(np.max(errors))),
                         "within_250ms": sum(e <= 0.25 for e in errors)}  # fmt: skip
    out["misses"] = [f"{r['file']}: {r['kind']} -> {r['first']}/{r['final']} ({r['text'][:40]!r})"
                     + (f" heard {r['heard'][:40]!r}" if r["heard"] else "")
                     for r in rows if _kind(r["final"], r["expect"]) != r["expect"]]  # fmt: skip
    return out


def report(figures: dict) -> str:
    lines = [f"{figures['files']} files"]
    for kind, c in figures["classes"].items():
        lines.append(f"  {kind:10s} {c['correct']:3d}/{c['n']:<3d} {100 * c['accuracy']:5.1f}%  {c['verdicts']}")
    p, m = figures["people"], figures["machines"]
    lines.append(f"people called machines: {figures['human_as_machine']}/{p} (first verdict: {figures['human_first_verdict_machine']})")
    lines.append(f"machines called people: {figures['machine_as_human']}/{m} (first verdict: {figures['machine_first_verdict_human']})")
    lines.append(f"first `human` revised by the detector (a beep, a greeting reading on): {figures['machine_revised_from_human']}"
                 f" machines, {figures['human_revised_to_machine']} people")
    if "asr_revised" in figures:
        lines.append(f"verdicts the transcript changed (--asr): {figures['asr_revised']}")
    for name, label in (("human_after_words_s", "person's verdict after their words end"), ("machine_s", "machine's verdict"),
                        ("machine_any_s", "machine's verdict, the detector's revisions of a first `human` included"),
                        ("machine_with_asr_s", "first machine verdict, the transcript's included")):
        if name in figures:
            f = figures[name]
            lines.append(f"{label}: median {f['median']:.2f} s, P95 {f['p95']:.2f} s, max {f['max']:.2f} s")
    b = figures["beeps"]
    lines.append(f"beeps: {b['found']}/{b['present']} found, {b['false']} false" + (
        f"; start error median {b['error_median_ms']} ms, max {b['error_max_ms']} ms, "
        f"{b['within_250ms']}/{b['found']} within 250 ms" if "error_median_ms" in b else ""))  # fmt: skip
    lines += [f"  miss: {m}" for m in figures["misses"]]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", choices=sorted(SEEDS), default="tuning")
    parser.add_argument("--corpus", type=Path, help="an already generated batch (default: generate one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--asr", metavar="MODEL", help="the transcript's second opinion by faster-whisper "
                        "(a size such as tiny.en, or a folder), as `duetaspan detect --asr` gives it")  # fmt: skip
    args = parser.parse_args()
    transcribe = whisper_transcriber(args.asr) if args.asr else None
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.corpus or Path(tmp)
        if args.corpus is None:
            generate(corpus, args.batch)
        if args.batch != "tuning":
            name = "answer_heldout.json" if args.batch == "heldout" else f"answer_{args.batch}.json"
            expected = json.loads((Path(__file__).parent / name).read_text())["sha256"]
            got = corpus_hash(corpus)
            if got != expected:
                print(f"warning: the held-out batch's hash is {got}, committed {expected} (other espeak-ng/sox?)")
        figures = score(corpus, transcribe)
    print(json.dumps(figures, indent=1) if args.json else report(figures))


if __name__ == "__main__":
    main()
