"""`ToolResult`: what one tool call produced, for the router (data), the model (reference) and logs."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from duetaspan.registry.errors import ToolError

REDACTED = "[redacted]"


@dataclass
class ToolResult:
    """The outcome of `ToolRegistry.call`.

    Attributes:
        name: the tool's registered name.
        arguments: the arguments as validated (full, including redacted fields: never log this directly).
        ok: False when the tool was not found, got invalid arguments, timed out or raised.
        data: the full result as JSON-like data (None on failure).
        reference: the one-line span text, `(tool result) ...`, or `(no information found)` on failure.
        error: a short message when `ok` is False.
        elapsed_ms: wall time of validation plus the call.
        redact: argument names to mask in logs and transcripts.
        side_effect: whether the tool acts on the world (bookings, transfers...).
        idempotency_key: the call's key (call id + tool + arguments; see `duetaspan.registry.effects`).
        replayed: a side-effect call answered from the call's ledger: the tool already ran with this key.

    Example:
        >>> r = ToolResult("pay", {"card": "4111111111111111", "amount": 5}, ok=True, redact=("card",))
        >>> r.redacted_arguments()
        {'card': '[redacted]', 'amount': 5}
    """

    name: str
    arguments: dict[str, Any]
    ok: bool
    data: Any = None
    reference: str = ""
    error: str | None = None
    elapsed_ms: float = 0.0
    redact: tuple[str, ...] = ()
    side_effect: bool = False
    idempotency_key: str | None = None
    replayed: bool = False
    exception: ToolError | None = field(default=None, repr=False, compare=False)

    def redacted_arguments(self, extra: Iterable[str] = ()) -> dict[str, Any]:
        """The arguments with `redact` (and `extra`) fields replaced by `[redacted]`."""
        hidden = set(self.redact) | set(extra)
        return {k: (REDACTED if k in hidden else v) for k, v in self.arguments.items()}

    def to_log(self) -> dict[str, Any]:
        """A JSON-ready record for logs, call artifacts and transcripts: redacted arguments, never raw ones."""
        return {
            "tool": self.name,
            "arguments": self.redacted_arguments(),
            "ok": self.ok,
            "reference": self.reference,
            "error": self.error,
            "elapsed_ms": round(self.elapsed_ms, 1),
            "side_effect": self.side_effect,
            "replayed": self.replayed,
        }

    def raise_for_error(self) -> ToolResult:
        """Raise the `ToolError` this call failed with (`ToolTimeout`, ...); return self when ok."""
        if self.ok:
            return self
        if self.exception is not None:
            raise self.exception
        raise ToolError(self.error or f"tool {self.name!r} failed")
