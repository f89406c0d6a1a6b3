"""The scripted ASR server, now public as `duetaspan.testing.asr` (this name stays for the suite's older
imports).

Command line: python -m duetaspan.testing.asr --port 8990 --script script.json
"""

from duetaspan.testing.asr import ScriptedASR as ScriptedASRServer
from duetaspan.testing.asr import main

__all__ = ["ScriptedASRServer", "main"]

if __name__ == "__main__":
    main()
