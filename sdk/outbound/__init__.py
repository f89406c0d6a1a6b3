"""`duetaspan.outbound`: calls the server places on its own.

Who answered: answer detection from the audio (speech cadence, beep and fax tones), a second opinion from the
transcript, and the verdicts' data (`docs/outbound.md`). Campaigns: a contact list dialled at a pace
(`max_concurrent`, `calls_per_minute`, inbound slots reserved), in calling windows of the callee's local
time, with retries per outcome and the do-not-call list, on the durable store (`duetaspan.store`), so a
crash loses no attempt and dials no number twice (`docs/campaigns.md`).

The detector's names load on first use (PEP 562): the detector needs scipy, and importing the agent (which
imports `duetaspan.outbound.handle`) must not load it for calls that detect nothing.

Example:
    >>> import numpy as np
    >>> from duetaspan.outbound import AnswerDetector
    >>> det = AnswerDetector(8000)
    >>> [v.verdict for v in det.push(np.zeros(4 * 8000, dtype=np.float32))]
    ['silence']
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from duetaspan.outbound.verdicts import MACHINE, VERDICTS, DetectTuning, Verdict

if TYPE_CHECKING:
    from duetaspan.outbound.detector import AnswerDetector, classify
    from duetaspan.outbound.dsp import read_wav

_LAZY = {
    "AnswerDetector": "duetaspan.outbound.detector",
    "classify": "duetaspan.outbound.detector",
    "read_wav": "duetaspan.outbound.dsp",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'duetaspan.outbound' has no attribute {name!r}")


__all__ = ["MACHINE", "VERDICTS", "AnswerDetector", "DetectTuning", "Verdict", "classify", "read_wav"]
