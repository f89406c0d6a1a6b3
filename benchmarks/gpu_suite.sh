#!/usr/bin/env bash
# The GPU checks and benchmarks in one go (at most SUITE_BUDGET_S = 480 s in all), written to ONE JSON file.
#
#   benchmarks/gpu_suite.sh [OUT.json] [--device cuda] [--model duetaspan-7b] [--quick] [--only a,b]
#                           [--tests PYTEST_K]
#
# Defaults: OUT=gpu_results.json, --device cuda, --model duetaspan-7b with random weights (no download).
# Runs, each under its own time limit: `pytest -m cuda_logic` (the GPU path's logic; with CUDA present its
# graph tests also run real CUDA graphs; `--tests EXPR` narrows it with -k), `duetaspan check` (first-contact
# self-test: memory, graphs, tick P50/P99, calls), benchmarks/engine.py (1 and 8 slots: step P50/P99, persona
# one pass vs stepped), benchmarks/spans.py (one-pass span prefill vs forced steps), benchmarks/capacity.py
# (tick time against concurrent calls, capacity at P99 <= 80 ms, graphs per batch bucket) and
# benchmarks/moshi_reference.py (our LM step beside Kyutai's moshi 0.2.13 `LMGen.step` on the same random
# shapes: a ratio; skipped, not failed, without moshi) and benchmarks/burst.py (8 callers ringing beside 8 live
# calls: skipped ticks and live lateness, before/after bounded opening). `--only` runs the named steps only
# (cuda_logic, check, engine_b1, engine_b8, spans, capacity, moshi_reference, burst). A failing or timed-out
# step is recorded (exit code, seconds, log tail) and the suite goes on; the exit status is the number of
# failed steps. Each step's limit is cut to what is left of SUITE_BUDGET_S (default 480, so the whole run
# fits one 600 s device command with room for the JSON); a step with under 10 s left is recorded as not run. `--quick` shrinks
# every run (the CPU smoke test: `benchmarks/gpu_suite.sh out.json --device cpu --model tiny-random --quick`;
# there `check` gets a 1 s budget: it tests the plumbing, not the CPU; cuda_logic collects only the test files
# that name the mark). PYTHON picks the interpreter.
set -uo pipefail

OUT="gpu_results.json"
if [[ $# -gt 0 && "$1" != --* ]]; then OUT="$1"; shift; fi
DEVICE="cuda"
MODEL="duetaspan-7b"
QUICK=0
ONLY=""
TESTS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --only) ONLY=",$2,"; shift 2 ;;
    --tests) TESTS=(-k "$2"); shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-python}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
COMMON=(--device "$DEVICE" --model "$MODEL" --random-weights)
THREADS=()
[[ "$DEVICE" == cpu ]] && THREADS=(--threads 1)

if [[ $QUICK == 1 ]]; then
  ENGINE_ARGS=(--frames 4 --warmup 1 --voice-frames 8 --max-stepped 4)
  ENGINE_SLOTS=(1)
  SPANS_ARGS=(--sizes 0,16 --repeats 1 --max-single 4)
  CAPACITY_ARGS=(--calls 1,2 --ticks 3 --warmup 1 --no-refine --every-count)  # a loaded CPU may tick 1 call >160 ms
  CHECK_ARGS=(--max-calls 2 --budget-ms 30000)  # timing is not under test: a nice-19 worker may wait seconds
  MOSHI_ARGS=(--steps 5 --warmup 1)
  BURST_ARGS=(--live 1 --opening 1 --warmup 2 --after 2 --window 4)
  LIMIT=(120 120 120 240 120 120 120)
  # cuda_logic collects only the files that name the mark (the same tests as collecting all of tests/, which
  # costs ~25 s of CPU more); a test marked from a conftest hook instead would be missed here, not in a full run
  mapfile -t TEST_PATHS < <(cd "$ROOT" && grep -rl --include='test_*.py' cuda_logic tests | sort)
else
  ENGINE_ARGS=(--frames 100 --warmup 10)
  ENGINE_SLOTS=(1 8)
  SPANS_ARGS=(--repeats 3 --max-single 64)
  CAPACITY_ARGS=(--ticks 60 --warmup 8)
  CHECK_ARGS=()
  MOSHI_ARGS=(--steps 100 --warmup 10)
  BURST_ARGS=(--live 8 --opening 8)
  # engine (each), spans, capacity, cuda_logic, check, moshi, burst: 35*2+40+90+90+60+45+60 = 455 <= 480
  LIMIT=(35 40 90 90 60 45 60)
  TEST_PATHS=(tests)
fi

names=()
BUDGET="${SUITE_BUDGET_S:-480}"
START=$SECONDS
wanted() { [[ -z "$ONLY" || "$ONLY" == *",$1,"* ]]; }
capped() {  # capped LIMIT_S: the step's limit, cut to what is left of the suite budget (0: do not run)
  local left=$((BUDGET - (SECONDS - START)))
  if (( left < 10 )); then echo 0; elif (( $1 < left )); then echo "$1"; else echo "$left"; fi
}
skip_step() {  # skip_step NAME: recorded as not run (the suite budget is spent)
  echo "== $1: not run, the suite budget of ${BUDGET} s is spent" >&2
  echo "suite budget of ${BUDGET} s spent before this step" >"$WORK/$1.log"
  echo "125 0" >"$WORK/$1.status"
  names+=("$1")
}
run_cmd() {  # run_cmd NAME LIMIT_S COMMAND... (the command writes its figures to --json WORK/NAME.json)
  local name="$1" limit; limit="$(capped "$2")"; shift 2
  wanted "$name" || return 0
  (( limit > 0 )) || { skip_step "$name"; return 0; }
  local t0=$SECONDS
  echo "== $name: $*" >&2
  timeout "$limit" "$@" --json "$WORK/$name.json" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$rc $((SECONDS - t0))" >"$WORK/$name.status"
  tail -n 4 "$WORK/$name.log" >&2
  names+=("$name")
}
run() {  # run NAME LIMIT_S SCRIPT ARGS...
  local name="$1" limit="$2" script="$3"; shift 3
  run_cmd "$name" "$limit" "$PY" "$HERE/$script" "$@"
}

if wanted cuda_logic; then  # the GPU path's logic first: a defect there explains everything after it
  t0=$SECONDS
  echo "== cuda_logic: pytest -m cuda_logic ${TESTS[*]}" >&2
  (cd "$ROOT" && timeout "$(capped "${LIMIT[3]}")" "$PY" -m pytest -q -m cuda_logic -p no:cacheprovider \
    --junitxml "$WORK/cuda_logic.xml" "${TESTS[@]}" "${TEST_PATHS[@]}") >"$WORK/cuda_logic.log" 2>&1
  echo "$? $((SECONDS - t0))" >"$WORK/cuda_logic.status"
  tail -n 2 "$WORK/cuda_logic.log" >&2
  names+=(cuda_logic)
fi
run_cmd check "${LIMIT[4]}" "$PY" -m duetaspan check "${COMMON[@]}" "${THREADS[@]}" "${CHECK_ARGS[@]}"
for slots in "${ENGINE_SLOTS[@]}"; do
  run "engine_b$slots" "${LIMIT[0]}" engine.py "${COMMON[@]}" "${THREADS[@]}" --slots "$slots" "${ENGINE_ARGS[@]}"
done
run spans "${LIMIT[1]}" spans.py "${COMMON[@]}" "${THREADS[@]}" "${SPANS_ARGS[@]}"
run capacity "${LIMIT[2]}" capacity.py "${COMMON[@]}" "${THREADS[@]}" "${CAPACITY_ARGS[@]}"
run moshi_reference "${LIMIT[5]}" moshi_reference.py "${COMMON[@]}" "${THREADS[@]}" "${MOSHI_ARGS[@]}"
run burst "${LIMIT[6]}" burst.py "${COMMON[@]}" "${THREADS[@]}" "${BURST_ARGS[@]}"

"$PY" - "$OUT" "$WORK" "$DEVICE" "$MODEL" "$QUICK" "${names[@]}" <<'EOF'
import json, platform, subprocess, sys, time
import xml.etree.ElementTree as ET
from pathlib import Path

out, work, device, model, quick, *names = sys.argv[1:]
work = Path(work)
suite = {
    "suite": "duetaspan gpu_suite",
    "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    "device": device,
    "model": model,
    "random_weights": True,
    "quick": quick == "1",
    "host": platform.node(),
    "python": platform.python_version(),
    "benchmarks": {},
}
try:
    if device == "cpu":  # the version without importing torch (~2.5 s of CPU: the smoke test's last step)
        from importlib.metadata import version

        suite["torch"] = version("torch")
    else:
        import torch

        suite["torch"] = torch.__version__
    if device != "cpu" and torch.cuda.is_available():
        suite["gpu"] = torch.cuda.get_device_name(0)
        suite["cuda"] = torch.version.cuda
except Exception as exc:  # the figures still matter without this
    suite["torch_error"] = repr(exc)
try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    suite["nvidia_smi"] = smi.stdout.strip()
except Exception:
    pass
failed = 0
for name in names:
    rc, seconds = (work / f"{name}.status").read_text().split()
    entry = {"exit_code": int(rc), "seconds": int(seconds)}
    result, junit = work / f"{name}.json", work / f"{name}.xml"
    if junit.is_file():  # pytest: its own counts, so "none skipped" is visible in the figures
        try:
            suite_el = ET.parse(junit).getroot()
            suite_el = suite_el if suite_el.tag == "testsuite" else suite_el.find("testsuite")
            counts = {k: int(suite_el.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
            counts["seconds"] = float(suite_el.get("time", 0))
            result.write_text(json.dumps(counts))
        except Exception as exc:  # a broken report is a failed step
            entry["junit_error"] = repr(exc)
    if result.is_file():  # kept on failure too: `check` explains why a device cannot serve real time
        entry["result"] = json.loads(result.read_text())
    if int(rc) != 0 or not result.is_file():
        failed += 1
        entry["timed_out"] = int(rc) == 124
        entry["log_tail"] = (work / f"{name}.log").read_text()[-3000:]
    suite["benchmarks"][name] = entry
def result_of(name):
    return suite["benchmarks"].get(name, {}).get("result", {})

cap, check, ref, tests, burst = (result_of(n) for n in ("capacity", "check", "moshi_reference", "cuda_logic",
                                                         "burst"))
bursts = {r["mode"]: r for r in burst.get("results", [])}
suite["summary"] = {
    "capacity_calls_p99_80ms": cap.get("capacity_calls"),
    "batch1_tick_p50_ms": cap.get("batch1_tick_p50_ms"),
    "ratio_b8_over_b1": cap.get("ratio_b8_over_b1"),
    "cuda_graphs": cap.get("cuda_graphs"),
    "check_ok": check.get("ok"),
    "check_calls": check.get("capacity_calls"),
    "graphs_captured": check.get("graphs_captured"),
    "cuda_logic_tests": tests.get("tests"),
    "cuda_logic_skipped": tests.get("skipped"),
    "moshi_ratio_p50": ref.get("ratio_p50"),
    "burst_skipped_ticks_old_new": [bursts.get(m, {}).get("skipped_ticks") for m in ("old", "new")],
    "burst_live_lateness_max_ms_old_new": [bursts.get(m, {}).get("live_lateness_max_ms") for m in ("old", "new")],
    "failed": failed,
}
Path(out).write_text(json.dumps(suite, indent=2))
print(json.dumps(suite["summary"]))
print(f"wrote {out}")
sys.exit(failed)
EOF
