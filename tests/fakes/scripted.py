"""What the scripted loopback servers share, now public in `duetaspan.testing.servers` (re-exported here for
the suite's older imports)."""

from duetaspan.testing.servers import ScriptedServer, hang_until_disconnect

__all__ = ["ScriptedServer", "hang_until_disconnect"]
