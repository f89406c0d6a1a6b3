"""Importing the agent, or starting `serve`, does not load scipy: answer detection (whose resampler needs
scipy.signal) loads it on the first call that is detected (`duetaspan.agent.answer`, the lazy names of `duetaspan.outbound`). Checked in a fresh
interpreter, whose `sys.modules` nothing else in the test run has filled."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import REPO_ROOT

PROBE = """
import json, sys
from duetaspan import Agent
import duetaspan.agent, duetaspan.serving, duetaspan.cli
import duetaspan.adapters.sip.bridge, duetaspan.adapters.twilio.bridge
before = sorted(m for m in sys.modules if m == "scipy" or m.startswith(("scipy.", "duetaspan.outbound.")))
from duetaspan.outbound import AnswerDetector  # the lazy name still resolves, and brings the detector
import duetaspan.outbound.gate  # what `serve` imports at start (its calls' answer verdicts)
served = "scipy" in sys.modules
from duetaspan.outbound.dsp import PhoneFrames
PhoneFrames(16000)  # the first detected call at a rate it must filter down to 8 kHz: scipy.signal now
print(json.dumps({"before": before, "served": served, "after": "scipy" in sys.modules and AnswerDetector.__name__}))
"""


def test_importing_the_agent_does_not_load_scipy():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [m for m in got["before"] if m.startswith("scipy")], got["before"]
    assert not {"duetaspan.outbound.detector", "duetaspan.outbound.dsp", "duetaspan.outbound.gate"} & set(
        got["before"]
    ), got["before"]
    assert got["served"] is False  # ~1.3 s of CPU that every `serve` start paid, detection or not
    assert got["after"] == "AnswerDetector"
