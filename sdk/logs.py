"""One log stream for a Pipecat bot on duetaspan: Pipecat logs through loguru, the SDK through `logging`.

`bridge_logging()` forwards loguru's records into `logging` (under the loguru record's module name, e.g.
`pipecat.transports.base_output`) and stamps every record with the call it belongs to (`%(call_id)s`), so
one handler, one format and one level cover both. The call id comes from `call_context(call_id)` (a context
variable): everything a call's tasks log, Pipecat's included, carries it, because tasks inherit the context
they were created in. `Agent.service(call)` enters it for the task that builds the call's pipeline.

Example:
    >>> import logging
    >>> bridge = bridge_logging(level=logging.INFO)        # doctest: +SKIP
    >>> with call_context("CA123"):                        # doctest: +SKIP
    ...     logging.getLogger("duetaspan.x").info("hello")  # 12:00:00 INFO [CA123] duetaspan.x: hello
    >>> bridge.close()                                     # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger as loguru_logger

CALL_ID: contextvars.ContextVar[str] = contextvars.ContextVar("duetaspan_call_id", default="-")
DEFAULT_FORMAT = "%(asctime)s %(levelname)-7s [%(call_id)s] %(name)s: %(message)s"


def current_call_id() -> str:
    """The call id logs of the running task are stamped with ("-" outside a call)."""
    return CALL_ID.get()


def bind_call(call_id: str) -> contextvars.Token[str]:
    """Stamp this task's logs (and those of tasks it creates from now on) with `call_id`."""
    return CALL_ID.set(call_id)


@contextlib.contextmanager
def call_context(call_id: str) -> Iterator[None]:
    """Logs inside (and from tasks created inside) carry `call_id`."""
    token = CALL_ID.set(call_id)
    try:
        yield
    finally:
        CALL_ID.reset(token)


class CallIdFilter(logging.Filter):
    """Adds `record.call_id` (the record's own when a sender set one, else the current call's)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "call_id", None):
            record.call_id = CALL_ID.get()
        return True


def _forward(message: Any) -> None:
    """A loguru sink: the record, re-emitted through `logging` under its module's logger name."""
    record = message.record
    name = record["name"] or "loguru"
    target = logging.getLogger(name)
    level = record["level"].no
    if not target.isEnabledFor(level):
        return
    exc = record["exception"]
    exc_info = (exc.type, exc.value, exc.traceback) if exc is not None and exc.type is not None else None
    out = target.makeRecord(
        name,
        level,
        record["file"].path,
        record["line"],
        record["message"],
        (),
        exc_info,
        func=record["function"],
    )
    out.created = record["time"].timestamp()
    target.handle(out)


@dataclass
class LogBridge:
    """What `bridge_logging` installed; `close()` takes it out again."""

    handler: logging.Handler | None
    sink_id: int
    filter: CallIdFilter = field(default_factory=CallIdFilter)
    previous_level: int = logging.WARNING

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            loguru_logger.remove(self.sink_id)
        root = logging.getLogger()
        if self.handler is not None:
            root.removeHandler(self.handler)
        for handler in root.handlers:
            handler.removeFilter(self.filter)
        root.setLevel(self.previous_level)


def bridge_logging(
    level: int | str = logging.INFO,
    *,
    handler: logging.Handler | None = None,
    fmt: str = DEFAULT_FORMAT,
    install_handler: bool = True,
) -> LogBridge:
    """Route loguru (Pipecat) into `logging` and stamp every record with its call id.

    Args:
        level: the root logger's level (loguru records below it are dropped early).
        handler: where the one stream goes (default: stderr); it gets `fmt` unless it has a formatter.
        fmt: the format; `%(call_id)s` is the call's id ("-" outside a call).
        install_handler: False keeps your own `logging` setup: the filter is added to the root logger's
            existing handlers instead.

    Loguru's default stderr sink is removed, so nothing is printed twice.
    """
    root = logging.getLogger()
    previous = root.level
    root.setLevel(level)
    flt = CallIdFilter()
    installed = None
    if install_handler:
        installed = handler or logging.StreamHandler(sys.stderr)
        if installed.formatter is None:
            installed.setFormatter(logging.Formatter(fmt))
        root.addHandler(installed)
    for h in root.handlers:
        h.addFilter(flt)
    with contextlib.suppress(ValueError):
        loguru_logger.remove(0)  # loguru's default stderr sink (id 0), if still there
    sink_id = loguru_logger.add(_forward, level=0, format="{message}")
    return LogBridge(installed, sink_id, flt, previous)


__all__ = [
    "CALL_ID",
    "CallIdFilter",
    "LogBridge",
    "bind_call",
    "bridge_logging",
    "call_context",
    "current_call_id",
]
