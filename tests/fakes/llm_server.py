"""The scripted OpenAI-compatible chat server, now public as `duetaspan.testing.llm` (this name stays for the
suite's older imports).

Command line: python -m duetaspan.testing.llm --port 8004 --script script.json
"""

from duetaspan.testing.llm import ScriptedLLM as ScriptedLLMServer
from duetaspan.testing.llm import main

__all__ = ["ScriptedLLMServer", "main"]

if __name__ == "__main__":
    main()
