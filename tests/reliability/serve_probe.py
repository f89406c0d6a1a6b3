"""Runs the real `duetaspan` command line in this process with a resource probe beside it (tests, load bench).

    python -m tests.reliability.serve_probe --stats stats.jsonl [--force-ret-every 4] -- serve --twilio ...

Every `--interval` seconds one JSON line is appended to `--stats`: live asyncio tasks, threads (by name),
open file descriptors, RSS, the engine clock's figures, free slots and live calls. When the file
`<stats>.collect` appears, the next line is taken after a full `gc.collect()` (and says so in `collected`):
cyclic garbage not yet collected is not a leak, and that is how the driver tells them apart. With `--force-ret-every S`
each call gets a `<ret>` every S seconds of its life (as the model would sample one), so that router and ASR
are exercised under load even though random weights almost never sample `<ret>`. Nothing else is changed:
the command runs exactly as `python -m duetaspan ...` would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from duetaspan import cli
from duetaspan.agent import Agent


def resources() -> dict[str, Any]:
    """This process's tasks, threads, fds and RSS (call on the event loop)."""
    rss_kb = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    names = Counter(_thread_kind(t.name) for t in threading.enumerate())
    return {
        "tasks": len(asyncio.all_tasks()),
        "task_names": sorted(Counter(_task_kind(t) for t in asyncio.all_tasks()).items()),
        "threads": threading.active_count(),
        "thread_kinds": sorted(names.items()),
        "fds": len(os.listdir("/proc/self/fd")),
        "fd_kinds": sorted(fd_kinds().items()),
        "rss_mb": round(rss_kb / 1024, 1),
    }


_TCP_STATES = {"06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "04": "FIN_WAIT1",
               "05": "FIN_WAIT2", "0B": "CLOSING", "02": "SYN_SENT", "03": "SYN_RECV"}  # fmt: skip


def fd_kinds() -> Counter[str]:
    """Open descriptors by kind: `tcp:PORT` (listening), `tcp:PORT<-` (accepted on PORT), `tcp->PORT` (a
    connection to PORT; a state other than ESTABLISHED is appended, e.g. `CLOSE_WAIT`), `pipe`,
    `anon_inode:[eventfd]`, `file:NAME`..."""
    rows = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError):
            for row in Path(table).read_text().splitlines()[1:]:
                cols = row.split()
                local, remote = (int(c.rsplit(":", 1)[1], 16) for c in cols[1:3])
                rows.append((local, remote, cols[3], cols[9]))
    listening = {local for local, _, state, _ in rows if state == "0A"}
    sockets: dict[str, str] = {}
    for local, remote, state, inode in rows:
        suffix = "" if state in ("01", "0A") else " " + _TCP_STATES.get(state, state)
        if state == "0A":
            sockets[inode] = f"tcp:{local}"
        elif local in listening:
            sockets[inode] = f"tcp:{local}<-{suffix}"
        else:
            sockets[inode] = f"tcp->{remote}{suffix}"
    kinds: Counter[str] = Counter()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while we looked (e.g. the listing's own descriptor)
            continue
        if target.startswith("socket:["):
            kinds[sockets.get(target[8:-1], "socket")] += 1
        elif target.startswith("pipe:"):
            kinds["pipe"] += 1
        elif target.startswith("/"):
            kinds["file:" + Path(target).name] += 1
        else:
            kinds[target] += 1
    return kinds


def census(top: int = 25) -> list[tuple[str, int]]:
    """Live objects by type (gc-tracked), the most numerous first: where per-call leaks show up."""
    gc.collect()
    counts = Counter(type(o).__qualname__ for o in gc.get_objects())
    return counts.most_common(top)


def _thread_kind(name: str) -> str:
    return name.rsplit("_", 1)[0] if name.startswith(("asyncio_", "ThreadPoolExecutor")) else name


def _task_kind(task: asyncio.Task) -> str:
    name = task.get_name()
    if name.startswith("Task-"):  # unnamed: say which coroutine it runs
        coro = task.get_coro()
        return "Task:" + getattr(coro, "__qualname__", type(coro).__name__)
    return name.split("::")[0][:60]


class Probe:
    """Tracks the agent and its live sessions; writes the stats lines."""

    def __init__(
        self, path: Path, interval: float, force_ret_every: float | None, census_every: int = 0
    ) -> None:
        self.census_every = census_every
        self.path = path
        self.collect_request = path.with_name(path.name + ".collect")
        self.interval = interval
        self.force_ret_every = force_ret_every
        self.agents: list[Agent] = []
        self.sessions: set[Any] = set()
        self.forced = 0

    def install(self) -> None:
        probe = self
        start, create = Agent.start, Agent.create_session

        async def start_(agent: Agent) -> None:
            await start(agent)
            probe.agents.append(agent)

        def create_(agent: Agent, *args: Any, **kwargs: Any) -> Any:
            session = create(agent, *args, **kwargs)
            probe.sessions.add(session)
            if probe.force_ret_every:
                task = asyncio.ensure_future(probe._rets(session))
                session.service._tasks.add(task)  # keep a reference; it ends with the call
                task.add_done_callback(session.service._tasks.discard)
            return session

        Agent.start, Agent.create_session = start_, create_  # type: ignore[method-assign]

    async def _rets(self, session: Any) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await session.service.started.wait()
            while not session.service._closed:
                await asyncio.sleep(self.force_ret_every)
                slot = session.service.slot
                if slot is None or slot.closed or session.service._closed:
                    break
                slot.force_ret()
                self.forced += 1
        self.sessions.discard(session)

    async def run(self) -> None:
        n = 0
        while True:
            collected = None
            if self.collect_request.exists():  # the driver asks for a sample after a full collection
                collected = gc.collect()
                self.collect_request.unlink()
            line = {"t": round(time.time(), 3), **resources(), "forced_rets": self.forced}
            if collected is not None:
                line["collected"] = collected
            if self.census_every and n % self.census_every == 0:
                line["census"] = census()
            n += 1
            for agent in self.agents:
                if agent.runner is not None:
                    line["clock"] = agent.runner.clock.summary()
                    line["free_slots"] = agent.free_slots
                    line["max_calls"] = agent.runner.max_calls
            line["live_sessions"] = sum(1 for s in self.sessions if not s.service._closed)
            with self.path.open("a") as f:
                f.write(json.dumps(line) + "\n")
            await asyncio.sleep(self.interval)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stats", type=Path, required=True)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--force-ret-every", type=float, default=None)
    parser.add_argument(
        "--census-every", type=int, default=0, help="count live objects by type every N samples"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the duetaspan arguments")
    ns = parser.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    probe = Probe(ns.stats, ns.interval, ns.force_ret_every, ns.census_every)
    probe.install()
    args = cli.build_parser().parse_args(command)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )

    async def run() -> int:
        monitor = asyncio.create_task(probe.run(), name="serve-probe")
        try:
            result = args.func(args)
            return int((await result) if inspect.isawaitable(result) else result or 0)
        finally:
            monitor.cancel()

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
