#!/usr/bin/env bash
# Installs everything the test suite needs into ./.venv (created if missing) and runs it.
# This is the README's test command and what .ci/run calls. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first and alone, so that the CPU build on this disk (or PyPI's default) is taken before anything
# else can pull a CUDA build.
python -m pip install -q 'torch>=2.4,<2.14'
# the ray extra in the same resolution as the rest, so its protobuf stays within Pipecat's pin
python -m pip install -q -e '.[dev,ray,tracing]'
# Kyutai's reference implementation, for parity tests only: its own pins (torch<2.10, ...) conflict with ours.
python -m pip install -q --no-deps 'moshi==0.2.13'

# Real Chromium for the browser test (Debian's package); skipped quietly where apt is unavailable.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
        || echo "warning: could not install chromium; browser tests will be skipped" >&2
fi

export NO_TORCH_COMPILE=1 NO_CUDA_GRAPH=1
ruff check .
set +e
python -m pytest -q "$@"
rc=$?
set -e
# pytest exits 5 when nothing was collected: that is a failure for CI, not a pass.
exit $rc
