"""`duetaspan.outbound`: calls the server places on its own.

Who answered: answer detection from the audio (speech cadence, beep and fax tones), a second opinion from the
transcript, and the verdicts' data (`docs/outbound.md`). Campaigns: a contact list dialled at a pace
(`max_concurrent`, `calls_per_minute`, inbound slots reserved), in calling windows of the callee's local
time, with retries per outcome and the do-not-call list, on the durable store (`duetaspan.store`), so a
crash loses no attempt and dials no number twice (`docs/campaigns.md`).

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

if TYPE_CHECKING:
    from duetaspan.outbound.detector import AnswerDetector, classify
    from duetaspan.outbound.dsp import read_wav
    from duetaspan.outbound.verdicts import MACHINE, VERDICTS, DetectTuning, Verdict

# imported on first use: the detector's DSP loads scipy.signal (seconds of CPU), which `duetaspan campaign`
# and the store's modules (`duetaspan.outbound.status`, `.handle`, ...) never need
_LAZY = {"AnswerDetector": "detector", "classify": "detector", "read_wav": "dsp", "MACHINE": "verdicts",
         "VERDICTS": "verdicts", "DetectTuning": "verdicts", "Verdict": "verdicts"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"duetaspan.outbound.{module}"), name)


__all__ = ["MACHINE", "VERDICTS", "AnswerDetector", "DetectTuning", "Verdict", "classify", "read_wav"]
