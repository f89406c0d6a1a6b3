"""Load benchmark: N concurrent simulated Twilio calls against `duetaspan serve --twilio --model tiny-random`.

The server is the real command line in a subprocess (with a probe that samples its asyncio tasks, threads,
fds and RSS every half second); its router and ASR are the scripted loopback servers of `tests/fakes`, and
each call gets a `<ret>` every few seconds so retrievals run under load. Each call streams recorded caller
audio at real time (signed webhook, signed single-use stream token, marks echoed like Twilio) and ends with
`stop`. Printed: calls closed normally, whole artifacts, model frames against real time, tick lateness and
engine step P50/P99 (from the artifacts), retrieval counts, and tasks/threads/fds/RSS at the baseline (after a
shorter warm-up wave of as many calls), at the peak and after the calls. Exit status 1 when anything failed or leaked.

    python benchmarks/load.py [--calls 20] [--seconds 120] [--waves 1] [--ret-every 4] [--workdir DIR]

The CI version is `tests/reliability/test_load.py` (fewer, shorter calls).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.reliability.load_driver import LoadPlan, run_load


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--ramp", type=float, default=5.0, help="spread the call starts over this time")
    parser.add_argument(
        "--ret-every", type=float, default=4.0, help="force a <ret> per call this often (0: never)"
    )
    parser.add_argument("--waves", type=int, default=1, help="main waves (2+: memory steady across waves)")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds of the warm-up wave (same calls)")
    parser.add_argument("--workdir", type=Path, help="keep the server log, stats and artifacts here")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args()
    plan = LoadPlan(
        calls=args.calls,
        duration_s=args.seconds,
        ramp_s=args.ramp,
        force_ret_every=args.ret_every,
        warmup_s=args.warmup,
        waves=args.waves,
    )
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="duetaspan-load-"))
    report = asyncio.run(run_load(plan, workdir))
    print("\n".join(report.lines()))
    problems = report.problems()
    for problem in problems[:40]:
        print("PROBLEM", problem)
    print(f"workdir {workdir}")
    if args.json:
        lat = report.lateness()
        print(json.dumps({"calls": plan.calls, "seconds": plan.duration_s, "problems": len(problems),
                          "baseline": report.baseline, "after": report.after, "peak": report.peak,
                          "lateness_p50_ms": float(lat.mean()) if lat.size else None}))  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
