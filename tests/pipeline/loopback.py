"""The in-process Pipecat transport, now public as `duetaspan.testing.loopback` (kept for older imports)."""

from duetaspan.testing.loopback import LoopbackTransport

__all__ = ["LoopbackTransport"]
