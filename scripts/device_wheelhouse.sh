#!/usr/bin/env bash
# Wheels for the GPU suite on a Python 3.12 x86-64 machine that has PyTorch, numpy, safetensors, sentencepiece,
# huggingface_hub, tqdm and pytest but none of our other dependencies (the device machine of issue 26).
#
#   bash scripts/device_wheelhouse.sh [DIR]        # default DIR: .whl (keep it out of git: .git/info/exclude)
#
# It downloads, with --no-deps, the binary wheels (cp312 / py3, manylinux x86-64) of what `duetaspan.model`,
# `duetaspan check`, the benchmarks and the cuda_logic tests import beyond that base, at the versions installed
# here (so pydantic and pydantic-core match), then checks each wheel is for that machine (tested here: 8 wheels,
# 3.1 MiB, installed with Python 3.12's pip into a --target folder). On the device, from the repo root:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#     DIR/*.whl && mkdir -p /tmp/pkg && cp -r sdk /tmp/pkg/duetaspan && cp -r tools /tmp/pkg/duetaspan/tools \
#     && cp -r adapters /tmp/pkg/duetaspan/adapters && export PYTHONPATH=/tmp/pkg:/tmp/site
#
# (the copies lay `duetaspan` out as setup.py's LAYOUT does, without installing it).
set -euo pipefail
DIR="${1:-.whl}"
PY="${PYTHON:-python3}"
# What the suite imports that the device lacks (found with: python -c "import duetaspan.cli, ...; sys.modules").
NAMES=(pydantic pydantic-core annotated-types typing-inspection loguru loudness soxr pytest-asyncio)
mkdir -p "$DIR"
for name in "${NAMES[@]}"; do
  version="$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "$name==$version"
done
"$PY" - "$DIR" "${NAMES[@]}" <<'PYEOF'
import re, sys
from pathlib import Path

folder, names = Path(sys.argv[1]), sys.argv[2:]
wheels = sorted(folder.glob("*.whl"))
seen = {}
for w in wheels:
    dist, _version, *_, py, abi, plat = w.stem.split("-")
    ok_py = py in ("py3", "cp312") or "py3" in py.split(".")
    ok_plat = plat == "any" or ("x86_64" in plat and "manylinux" in plat)
    if not (ok_py and ok_plat):
        sys.exit(f"{w.name}: not for CPython 3.12 on manylinux x86-64")
    key = re.sub(r"[-_.]+", "_", dist).lower()
    if key in seen:
        sys.exit(f"two versions of {dist}: {seen[key]} and {w.name} (pip stops the install)")
    seen[key] = w.name
missing = [n for n in names if re.sub(r"[-_.]+", "_", n).lower() not in seen]
if missing:
    sys.exit(f"no wheel for {missing}")
size = sum(w.stat().st_size for w in wheels) / 2**20
print(f"{len(wheels)} wheels, {size:.1f} MiB in {folder} (the device tool carries 64 MiB a call)")
PYEOF
