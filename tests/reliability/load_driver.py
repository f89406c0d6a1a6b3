"""Simulated Twilio calls against a real `duetaspan serve --twilio` process, for the load test and
`benchmarks/load.py`.

`ServeProcess` starts `serve --twilio --model tiny-random` (through `serve_probe`, which records tasks, threads,
fds, RSS and the engine clock every half second) with an agent.toml whose router and ASR point at the scripted
loopback servers of `tests/fakes`. `run_load` then places N concurrent signed calls, each streaming recorded
caller audio at real time for `duration_s` (marks echoed like Twilio), ends them with `stop`, checks that every
call's artifacts are whole, and compares the server's resources after the calls with a baseline taken after a
warm-up wave. `LoadReport.problems()` lists everything that makes the run a failure.

Example:
    >>> async def main(tmp):                                        # doctest: +SKIP
    ...     report = await run_load(LoadPlan(calls=8, duration_s=10), workdir=tmp)
    ...     print("\\n".join(report.lines())); assert not report.problems()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, PUBLIC_URL, TwilioPeer
from tests.fakes.asr_server import ScriptedASRServer
from tests.fakes.llm_server import ScriptedLLMServer
from tests.support import REPO_ROOT, free_port, load_twilio_stream

FIXTURES = ("time_tokyo", "weather_sydney", "greeting", "order_status", "book_table", "account_balance")
FRAME_BYTES = 1920 * 2 * 2  # one 80 ms frame of 16-bit stereo in the call wav
POOL_LIMIT = 100  # aiohttp's default connector limit (the ASR client's pool)
ROUTER_API_KEY = "sk-load-test-router-key-7f3a9c"  # a fake secret the logs must never show


@dataclass
class LoadPlan:
    """What to run. `force_ret_every`: each call gets a `<ret>` that often (seconds), 0 for none."""

    calls: int = 8
    duration_s: float = 10.0
    ramp_s: float = 1.0  # calls start spread over this time, like real arrivals
    force_ret_every: float = 3.0
    # the warm-up wave reaches the same concurrency, so the baseline holds every per-concurrency high-water
    # mark (pool threads, allocator arenas, keep-alive sockets); growth after the long wave is then a leak
    warmup_calls: int | None = None  # default: `calls`
    warmup_s: float = 3.0
    waves: int = 1  # main waves; with 2+, memory must be steady from one wave's end to the next
    census_every: int = 0  # the probe counts live objects by type every N samples (leak hunting)
    settle_s: float = 3.0  # after the calls end, before the final resource sample
    verbose: int = 1  # -v / -vv for the server
    extra_config: str = ""  # appended to agent.toml
    llm_script: dict[str, Any] | None = None


@dataclass
class CallOutcome:
    call_sid: str
    close_code: int | None = None
    media_sent: int = 0
    media_back: int = 0
    marks_back: int = 0
    error: str | None = None


@dataclass
class LoadReport:
    plan: LoadPlan
    outcomes: list[CallOutcome] = field(default_factory=list)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    artifact_problems: list[str] = field(default_factory=list)
    stats: list[dict[str, Any]] = field(default_factory=list)  # the server's probe lines
    baseline: dict[str, Any] = field(default_factory=dict)  # after the warm-up wave
    after: dict[str, Any] = field(default_factory=dict)  # after the main wave has ended and settled
    peak: dict[str, Any] = field(default_factory=dict)
    log_errors: list[str] = field(default_factory=list)
    llm_requests: int = 0
    asr_requests: int = 0
    wall_s: float = 0.0
    log_text: str = ""
    pool_ports: tuple[int, ...] = ()  # the LLM and ASR servers' ports
    wave_after: list[dict[str, Any]] = field(default_factory=list)  # settled sample after each main wave

    # figures ------------------------------------------------------------------------------------
    def lateness(self) -> np.ndarray:
        """Tick lateness (ms) of every frame of the main wave's calls, as the artifacts recorded it."""
        values = [f["lateness_ms"] for r in self.records.values() for f in r["frames"]]
        return np.asarray(values, dtype=np.float64)

    def step_ms(self) -> np.ndarray:
        return np.asarray([f["step_ms"] for r in self.records.values() for f in r["frames"]], np.float64)

    def events(self, kind: str) -> int:
        return sum(len(r.get(kind, [])) for r in self.records.values())

    def leaks(self) -> list[str]:
        """Resources the server holds after the calls beyond what it held after the warm-up wave."""
        out = []
        b, a = self.baseline, self.after
        if not b or not a:
            return ["no resource samples from the server"]
        if a["tasks"] > b["tasks"]:
            out.append(f"asyncio tasks {b['tasks']} -> {a['tasks']}: {a['task_names']}")
        # idle executor workers stay in their pool (bounded by its max_workers); count the rest exactly
        base_own = _own_threads(b)
        after_own = _own_threads(a)
        if after_own > base_own:
            out.append(f"threads (not pool workers) {base_own} -> {after_own}: {a['thread_kinds']}")
        # keep-alive connections to the router's LLM and ASR servers stay in their clients' pools (bounded by
        # the concurrency they saw); every other kind of descriptor must be back to its baseline count
        pool = {f"tcp->{port}" for port in self.pool_ports}
        before, now = dict(map(tuple, b["fd_kinds"])), dict(map(tuple, a["fd_kinds"]))
        grown = {
            k: f"{before.get(k, 0)} -> {n}" for k, n in now.items() if k not in pool and n > before.get(k, 0)
        }
        if grown:
            out.append(f"file descriptors {b['fds']} -> {a['fds']}: {grown}")
        pooled = sum(n for k, n in now.items() if k in pool)
        if pooled > 2 * POOL_LIMIT:  # each client's pool is bounded (aiohttp: 100); idle ones expire
            out.append(f"{pooled} pooled connections to the LLM/ASR servers")
        # memory: the allocator keeps what a long wave needed at its peak, so with several waves the test is
        # that the end of the last wave holds no more than the end of the first (+5 %)
        first = self.wave_after[0] if len(self.wave_after) > 1 else b
        allowance = 1.05 if len(self.wave_after) > 1 else 1.25
        if a["rss_mb"] > first["rss_mb"] * allowance + 20:
            out.append(f"RSS {first['rss_mb']} MB -> {a['rss_mb']} MB")
        if a.get("free_slots") != a.get("max_calls"):
            out.append(f"free slots {a.get('free_slots')} of {a.get('max_calls')} after the calls")
        return out

    def problems(self) -> list[str]:
        out = [f"{o.call_sid}: {o.error}" for o in self.outcomes if o.error]
        out += [f"{o.call_sid}: closed with {o.close_code}" for o in self.outcomes if o.close_code != 1000]
        out += self.artifact_problems
        out += [f"server log: {line}" for line in self.log_errors]
        out += self.leaks()
        return out

    def lines(self) -> list[str]:
        p = self.plan
        lat, step = self.lateness(), self.step_ms()
        frames = sum(len(r["frames"]) for r in self.records.values())
        expected = len(self.records) * p.duration_s / 0.08  # every call lasts duration_s
        concealed = sum(r["summary"].get("input", {}).get("concealed", 0) for r in self.records.values())
        clock = (self.stats[-1].get("clock") if self.stats else None) or {}
        pct = lambda a, q: float(np.percentile(a, q)) if a.size else float("nan")  # noqa: E731
        b, a, k = self.baseline, self.after, self.peak
        return [
            f"calls                 {p.calls} concurrent x {p.duration_s:.0f} s x {p.waves} wave(s) "
            f"(ramp {p.ramp_s:g} s), wall {self.wall_s:.1f} s",
            f"closed normally       {sum(o.close_code == 1000 for o in self.outcomes)}/{len(self.outcomes)}; "
            f"artifacts whole {len(self.records) - len({x.split(':')[0] for x in self.artifact_problems})}"
            f"/{len(self.outcomes)}",
            f"media                 sent {sum(o.media_sent for o in self.outcomes)}, back "
            f"{sum(o.media_back for o in self.outcomes)} (20 ms chunks), marks back "
            f"{sum(o.marks_back for o in self.outcomes)}",
            f"model frames          {frames} of {expected:.0f} real-time ({frames / max(expected, 1):.0%}), "
            f"concealed (caller audio late) {concealed}",
            f"tick lateness         p50 {pct(lat, 50):.1f} ms  p99 {pct(lat, 99):.1f} ms  "
            f"max {lat.max() if lat.size else float('nan'):.1f} ms",
            f"engine step           p50 {pct(step, 50):.1f} ms  p99 {pct(step, 99):.1f} ms (all slots, one step)",
            f"clock (server)        ticks {clock.get('ticks')} skipped {clock.get('skipped_ticks')} "
            f"late {clock.get('late_ticks')}",
            f"retrieval             forced <ret> {self.events('rets')}, spans {self.events('spans')}, "
            f"late {self.events('late_spans')}, no-span {self.events('no_spans')}; "
            f"LLM requests {self.llm_requests}, ASR requests {self.asr_requests}",
            f"tasks                 baseline {b.get('tasks')}  peak {k.get('tasks')}  after {a.get('tasks')}",
            f"threads               baseline {b.get('threads')}  peak {k.get('threads')}  after "
            f"{a.get('threads')} (not pool workers: {_own_threads(b)} -> {_own_threads(a)})",
            f"file descriptors      baseline {b.get('fds')}  peak {k.get('fds')}  after {a.get('fds')} "
            f"(after: {dict(map(tuple, a.get('fd_kinds', [])))})",
            f"RSS                   baseline {b.get('rss_mb')} MB  peak {k.get('rss_mb')} MB  after "
            f"{a.get('rss_mb')} MB (after each wave: {[w['rss_mb'] for w in self.wave_after]})",
            f"errors in server log  {len(self.log_errors)}",
        ]


def _own_threads(sample: dict[str, Any]) -> int:
    kinds = dict(map(tuple, sample.get("thread_kinds", [])))
    return sum(n for k, n in kinds.items() if not k.startswith(("asyncio", "ThreadPoolExecutor")))


def default_llm_script() -> dict[str, Any]:
    return {"default": {"tool_call": {"name": "get_time", "arguments": {"place": "Tokyo"}}}}


def agent_toml(llm_url: str, asr_url: str, extra: str = "", modules: Sequence[str] = ()) -> str:
    return (
        '[persona]\nprompt = "You answer the phone for a load test."\n\n'
        f'[router]\nbase_url = "{llm_url}/v1"\nmodel = "scripted"\napi_key_env = "DUETASPAN_LOAD_KEY"\n\n'
        f'[asr]\nkind = "transcribe"\nurl = "{asr_url}/transcribe"\n\n'
        f'[tools]\nbuiltins = ["get_time"]\nmodules = {json.dumps(list(modules))}\n\n' + extra
    )


class ServeProcess:
    """`duetaspan serve --twilio --model tiny-random` in a subprocess, with the resource probe."""

    def __init__(
        self,
        workdir: Path,
        *,
        max_calls: int,
        config: str,
        verbose: int,
        force_ret_every: float,
        census_every: int = 0,
    ):
        self.workdir = workdir
        self.record_dir = workdir / "calls"
        self.stats_path = workdir / "stats.jsonl"
        self.log_path = workdir / "serve.log"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        (workdir / "agent.toml").write_text(config)
        self.cmd = [
            sys.executable, "-m", "tests.reliability.serve_probe", "--stats", str(self.stats_path),
            *(["--force-ret-every", str(force_ret_every)] if force_ret_every else []),
            *(["--census-every", str(census_every)] if census_every else []),
            "--", *(["-" + "v" * verbose] if verbose else []),
            "serve", "--twilio", "--host", "127.0.0.1", "--port", str(self.port), "--public-url", PUBLIC_URL,
            "--config", str(workdir / "agent.toml"), "--model", "tiny-random", "--device", "cpu",
            "--record-dir", str(self.record_dir), "--max-calls", str(max_calls),
        ]  # fmt: skip
        self.proc: subprocess.Popen | None = None

    @staticmethod
    def env() -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "OPENAI_"))}
        env |= {
            "TWILIO_ACCOUNT_SID": ACCOUNT_SID,
            "TWILIO_AUTH_TOKEN": AUTH_TOKEN,
            "TWILIO_API_BASE_URL": "http://127.0.0.1:9",
            "DUETASPAN_LOAD_KEY": ROUTER_API_KEY,
            "PYTHONPATH": str(REPO_ROOT),
        }
        return env

    @contextlib.asynccontextmanager
    async def running(self, ready_timeout_s: float = 120.0) -> AsyncIterator[ServeProcess]:
        self.start()
        try:
            await self._wait_ready(ready_timeout_s)
            yield self
        finally:
            self.stop()

    def start(self) -> None:
        with self.log_path.open("wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                self.cmd, env=self.env(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir
            )

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    async def _wait_ready(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as http:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"serve not ready after {timeout_s:.0f} s:\n{self.log_tail()}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(self.base_url + "/health") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.2)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 4000) -> str:
        return self.log_text()[-n:]

    def samples(self) -> list[dict[str, Any]]:
        if not self.stats_path.exists():
            return []
        out = []
        for line in self.stats_path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
        return out

    async def settled_sample(self, settle_s: float) -> dict[str, Any]:
        """A resource sample taken `settle_s` from now, after a full garbage collection in the server."""
        await asyncio.sleep(settle_s)
        before = len(self.samples())
        self.stats_path.with_name(self.stats_path.name + ".collect").touch()
        # the probe may write more lines before this looks (its interval is short; a loaded machine delays
        # this loop): the sample is the first one after the request that says it followed a collection
        deadline = time.monotonic() + 120.0
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            collected = [s for s in self.samples()[before:] if "collected" in s]
            if collected:
                return collected[0]
        raise RuntimeError("the server's probe wrote no sample after a collection in 120 s")


def call_messages(call_sid: str, duration_s: float, offset: int = 0) -> list[dict[str, Any]]:
    """A Media Stream for `call_sid`: connected, start, `duration_s` of recorded caller audio, stop."""
    first = load_twilio_stream(FIXTURES[offset % len(FIXTURES)])
    connected, start = json.loads(json.dumps(first[0])), json.loads(json.dumps(first[1]))
    start["start"]["callSid"], start["start"]["accountSid"] = call_sid, ACCOUNT_SID
    stream_sid = start["streamSid"]
    payloads: list[str] = []
    i = offset
    while len(payloads) * 0.02 < duration_s:
        payloads += [m["media"]["payload"] for m in load_twilio_stream(FIXTURES[i % len(FIXTURES)])
                     if m["event"] == "media"]  # fmt: skip
        i += 1
    payloads = payloads[: round(duration_s / 0.02)]
    media = [
        {
            "event": "media",
            "streamSid": stream_sid,
            "media": {"track": "inbound", "chunk": str(n + 1), "timestamp": str(n * 20), "payload": p},
        }
        for n, p in enumerate(payloads)
    ]
    stop = {
        "event": "stop",
        "streamSid": stream_sid,
        "stop": {"accountSid": ACCOUNT_SID, "callSid": call_sid},
    }
    return [connected, start, *media, stop]


async def place_call(peer: TwilioPeer, call_sid: str, duration_s: float, offset: int = 0) -> CallOutcome:
    outcome = CallOutcome(call_sid)
    try:
        url = await peer.stream_url(call_sid)
        messages = call_messages(call_sid, duration_s, offset)
        outcome.media_sent = sum(m["event"] == "media" for m in messages)
        async with peer.open_stream(url) as ws:
            got = await peer.play(ws, messages, linger_s=0.3, wait_close_s=30)
        outcome.close_code = got.close_code
        outcome.media_back = len(got.of("media"))
        outcome.marks_back = len(got.of("mark"))
        bad = [p for p in got.media_bytes() if len(p) != 160]
        if bad:
            outcome.error = f"{len(bad)} media payloads of the wrong size"
    except Exception as exc:  # reported, never raised: the other calls go on
        outcome.error = f"{type(exc).__name__}: {exc}"
    return outcome


def check_artifacts(record_dir: Path, call_sid: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The call's record and everything wrong with its artifacts (missing, incomplete, torn, inconsistent)."""
    problems = []
    json_path, wav_path = record_dir / f"{call_sid}.json", record_dir / f"{call_sid}.wav"
    if not json_path.exists():
        return None, [f"{call_sid}: no {json_path.name}"]
    record = json.loads(json_path.read_text())
    if not record.get("complete"):
        problems.append(f"{call_sid}: record not complete")
    frames = len(record["frames"])
    if record["summary"].get("frames") != frames:
        problems.append(
            f"{call_sid}: summary says {record['summary'].get('frames')} frames, log has {frames}"
        )
    if [f["i"] for f in record["frames"]] != list(range(frames)):
        problems.append(f"{call_sid}: frame indices are not 0..{frames - 1}")
    size = wav_path.stat().st_size if wav_path.exists() else -1
    if size != 44 + frames * FRAME_BYTES:
        problems.append(f"{call_sid}: wav is {size} bytes, expected {44 + frames * FRAME_BYTES}")
    if frames == 0:
        problems.append(f"{call_sid}: no model frames at all")
    if record.get("errors"):
        problems.append(f"{call_sid}: errors {record['errors']}")
    return record, problems


async def run_wave(
    peer: TwilioPeer, prefix: str, n: int, duration_s: float, ramp_s: float
) -> list[CallOutcome]:
    async def one(i: int) -> CallOutcome:
        await asyncio.sleep(ramp_s * i / max(n, 1))
        return await place_call(peer, f"{prefix}{i:04d}", duration_s, offset=i)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def wait_for_records(record_dir: Path, sids: list[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all((record_dir / f"{sid}.json").exists() for sid in sids):
            return
        await asyncio.sleep(0.1)


async def run_load(plan: LoadPlan, workdir: Path) -> LoadReport:
    """Serve, warm up, run the main wave, settle, and measure (see the module docstring)."""
    workdir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, before anything runs)
    report = LoadReport(plan)
    llm = ScriptedLLMServer(plan.llm_script or default_llm_script())
    asr = ScriptedASRServer({"default": "What time is it in Tokyo at the moment?"})
    async with llm.serve() as llm_url, asr.serve() as asr_url:
        report.pool_ports = (int(llm_url.rsplit(":", 1)[1]), int(asr_url.rsplit(":", 1)[1]))
        server = ServeProcess(
            workdir,
            max_calls=plan.calls,
            config=agent_toml(llm_url, asr_url, plan.extra_config),
            verbose=plan.verbose,
            force_ret_every=plan.force_ret_every,
            census_every=plan.census_every,
        )
        async with server.running():
            peer = TwilioPeer(server.base_url)
            warmup = plan.calls if plan.warmup_calls is None else plan.warmup_calls
            if warmup:
                await run_wave(peer, "CAwarm", warmup, plan.warmup_s, plan.ramp_s)
            report.baseline = await server.settled_sample(plan.settle_s)
            n_before = len(server.samples())
            started = time.monotonic()
            for wave in range(plan.waves):
                outcomes = await run_wave(peer, f"CAload{wave}-", plan.calls, plan.duration_s, plan.ramp_s)
                report.outcomes += outcomes
                await wait_for_records(server.record_dir, [o.call_sid for o in outcomes])
                report.wave_after.append(await server.settled_sample(plan.settle_s))
            sids = [o.call_sid for o in report.outcomes]
            report.wall_s = time.monotonic() - started
            report.after = report.wave_after[-1]
            report.stats = server.samples()
            during = report.stats[n_before:]
            report.peak = {
                k: max((s[k] for s in during), default=None) for k in ("tasks", "threads", "fds", "rss_mb")
            }
            for sid in sids:
                record, problems = check_artifacts(server.record_dir, sid)
                if record is not None:
                    report.records[sid] = record
                report.artifact_problems += problems
        report.log_text = server.log_text()
    report.log_errors = [
        line for line in report.log_text.splitlines() if " ERROR " in line or " CRITICAL " in line
    ] + (["Traceback in the server log"] if "Traceback" in report.log_text else [])
    report.llm_requests, report.asr_requests = len(llm.requests), len(asr.requests)
    return report
