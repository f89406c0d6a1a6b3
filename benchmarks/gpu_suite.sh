#!/usr/bin/env bash
# The GPU benchmarks in one go (< 8 minutes on one H200), written to ONE JSON file.
#
#   benchmarks/gpu_suite.sh [OUT.json] [--device cuda] [--model duetaspan-7b] [--quick]
#
# Defaults: OUT=gpu_results.json, --device cuda, --model duetaspan-7b with random weights (no download).
# Runs benchmarks/engine.py (1 and 8 slots: step P50/P99, persona one pass vs stepped), benchmarks/spans.py
# (one-pass span prefill vs forced steps) and benchmarks/capacity.py (tick time against concurrent calls,
# capacity at P99 <= 80 ms, CUDA graphs per batch bucket), each under its own time limit. A failing or
# timed-out benchmark is recorded (exit code, seconds, log tail) and the suite goes on; the exit status is
# the number of failed benchmarks. `--quick` shrinks every run (the CPU smoke test:
# `benchmarks/gpu_suite.sh out.json --device cpu --model tiny-random --quick`). PYTHON picks the interpreter.
set -uo pipefail

OUT="gpu_results.json"
if [[ $# -gt 0 && "$1" != --* ]]; then OUT="$1"; shift; fi
DEVICE="cuda"
MODEL="duetaspan-7b"
QUICK=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PY="${PYTHON:-python}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
COMMON=(--device "$DEVICE" --model "$MODEL" --random-weights)
THREADS=()
[[ "$DEVICE" == cpu ]] && THREADS=(--threads 1)

if [[ $QUICK == 1 ]]; then
  ENGINE_ARGS=(--frames 4 --warmup 1 --voice-frames 8)
  ENGINE_SLOTS=(1)
  SPANS_ARGS=(--sizes 0,16 --repeats 1 --max-single 4)
  CAPACITY_ARGS=(--calls 1,2 --ticks 3 --warmup 1 --no-refine)
  LIMIT=(120 120 120)
else
  ENGINE_ARGS=(--frames 100 --warmup 10)
  ENGINE_SLOTS=(1 8)
  SPANS_ARGS=(--repeats 3 --max-single 64)
  CAPACITY_ARGS=(--ticks 60 --warmup 8)
  LIMIT=(100 120 240)
fi

names=()
run() {  # run NAME LIMIT_S SCRIPT ARGS...
  local name="$1" limit="$2" script="$3"; shift 3
  local t0=$SECONDS
  echo "== $name: $script $*" >&2
  timeout "$limit" "$PY" "$HERE/$script" "$@" --json "$WORK/$name.json" >"$WORK/$name.log" 2>&1
  local rc=$?
  echo "$rc $((SECONDS - t0))" >"$WORK/$name.status"
  tail -n 4 "$WORK/$name.log" >&2
  names+=("$name")
}

for slots in "${ENGINE_SLOTS[@]}"; do
  run "engine_b$slots" "${LIMIT[0]}" engine.py "${COMMON[@]}" "${THREADS[@]}" --slots "$slots" "${ENGINE_ARGS[@]}"
done
run spans "${LIMIT[1]}" spans.py "${COMMON[@]}" "${THREADS[@]}" "${SPANS_ARGS[@]}"
run capacity "${LIMIT[2]}" capacity.py "${COMMON[@]}" "${THREADS[@]}" "${CAPACITY_ARGS[@]}"

"$PY" - "$OUT" "$WORK" "$DEVICE" "$MODEL" "$QUICK" "${names[@]}" <<'EOF'
import json, platform, subprocess, sys, time
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
    import torch

    suite["torch"] = torch.__version__
    if torch.cuda.is_available():
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
    result = work / f"{name}.json"
    if int(rc) == 0 and result.is_file():
        entry["result"] = json.loads(result.read_text())
    else:
        failed += 1
        entry["timed_out"] = int(rc) == 124
        entry["log_tail"] = (work / f"{name}.log").read_text()[-3000:]
    suite["benchmarks"][name] = entry
cap = suite["benchmarks"].get("capacity", {}).get("result", {})
suite["summary"] = {
    "capacity_calls_p99_80ms": cap.get("capacity_calls"),
    "batch1_tick_p50_ms": cap.get("batch1_tick_p50_ms"),
    "ratio_b8_over_b1": cap.get("ratio_b8_over_b1"),
    "cuda_graphs": cap.get("cuda_graphs"),
    "failed": failed,
}
Path(out).write_text(json.dumps(suite, indent=2))
print(json.dumps(suite["summary"]))
print(f"wrote {out}")
sys.exit(failed)
EOF
