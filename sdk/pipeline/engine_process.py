"""The engine in its own process: `EngineProcess` is the engine runner on a `ProcessHost`, one per GPU.

`EngineProcess(spec)` behaves like `EngineRunner(engine)` (`attach`, `detach`, `clock`, `free_slots`, ...),
but the engine loads and ticks in a child process (`python -m duetaspan.pipeline.engine_process`, this
module's `main`), so the web server's event loop and the GPU loop never share a process, and a crashed engine
(CUDA error, OOM kill) cannot take the server down: its calls end with `EngineCrashed` (the pipeline service
cancels them), new ones are refused with it until a fresh process is loaded (`max_restarts`), and `crashes`
counts it for /metrics. The parent side lives in
`process_host`, the child side in `process_child`, the spec and messages in `process_wire`.

Example:
    >>> async def main():                                         # doctest: +SKIP
    ...     spec = EngineProcessSpec(model="duetaspan-7b", device="cuda:0", max_slots=16)
    ...     async with EngineProcess(spec) as runner:               # returns once the model is loaded
    ...         call = await runner.attach("CA1", on_output=print)  # raises EngineFull when all slots are busy
    ...         call.push(np.zeros(1920, np.float32))
    ...         await asyncio.sleep(1.0)
    ...         await call.close()
"""

from __future__ import annotations

from typing import Any

from duetaspan.pipeline.process_child import main
from duetaspan.pipeline.process_host import ProcessHost, RemoteClock
from duetaspan.pipeline.process_wire import EngineCrashed, EngineProcessSpec
from duetaspan.pipeline.runner import CallSlot, EngineRunner

__all__ = ["EngineCrashed", "EngineProcess", "EngineProcessSpec", "RemoteCallSlot", "RemoteClock", "main"]

RemoteCallSlot = CallSlot  # a call on an engine process has the same handle as any other


class EngineProcess(EngineRunner):
    """An engine in a child process, with the `EngineRunner` interface.

    Args:
        spec: what the child loads (preset or files, device, slots) and its clock settings.
        max_calls: admission limit (default `spec.max_slots`); a full engine raises `EngineFull` at once.
        start_timeout_s: how long model loading (and graph capture) may take.
        env: extra environment for the child (e.g. `{"CUDA_VISIBLE_DEVICES": "1"}` for an engine per GPU).
        max_restarts, restart_delay_s: fresh engine processes after crashes (the crashed one's calls end).
    """

    host: ProcessHost

    def __init__(
        self,
        spec: EngineProcessSpec | None = None,
        *,
        max_calls: int | None = None,
        start_timeout_s: float = 900.0,
        env: dict[str, str] | None = None,
        name: str = "duetaspan-engine-process",
        max_restarts: int = 3,
        restart_delay_s: float = 1.0,
    ) -> None:
        host = ProcessHost(
            spec, start_timeout_s=start_timeout_s, env=env, name=name,
            max_restarts=max_restarts, restart_delay_s=restart_delay_s,
        )  # fmt: skip
        super().__init__(host=host, max_calls=max_calls, name=name)

    @property
    def spec(self) -> EngineProcessSpec:
        return self.host.spec

    @property
    def start_timeout_s(self) -> float:
        return self.host.start_timeout_s

    @property
    def pid(self) -> int | None:
        return self.host.pid

    @property
    def info(self) -> dict[str, Any]:
        """What the child reported once loaded: pid, device, max_slots, graphs captured, load time."""
        return self.host.info

    async def start(self) -> None:
        """Start the engine process and wait until its model is loaded (idempotent)."""
        await self.host.start()

    async def stop(self, timeout_s: float = 10.0) -> None:
        """End every call and stop the engine process (politely, then by signal)."""
        await self.host.stop(timeout_s)


if __name__ == "__main__":
    main()
