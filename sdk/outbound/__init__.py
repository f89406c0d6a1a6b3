"""Outbound calls that know who answered: answer detection from the audio (speech cadence, beep and fax
tones), a second opinion from the transcript, and the verdicts' data (`docs/outbound.md`).

Example:
    >>> import numpy as np
    >>> from duetaspan.outbound import AnswerDetector
    >>> det = AnswerDetector(8000)
    >>> [v.verdict for v in det.push(np.zeros(4 * 8000, dtype=np.float32))]
    ['silence']
"""

from duetaspan.outbound.detector import AnswerDetector, classify
from duetaspan.outbound.dsp import read_wav
from duetaspan.outbound.verdicts import MACHINE, VERDICTS, DetectTuning, Verdict

__all__ = ["MACHINE", "VERDICTS", "AnswerDetector", "DetectTuning", "Verdict", "classify", "read_wav"]
