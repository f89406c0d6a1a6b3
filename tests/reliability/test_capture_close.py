"""Hang-up while caller audio is still queued for question capture (found by the load test, issue #9): chunks
waiting for the capture's lock when the call closes are dropped quietly instead of failing on the VAD thread
that `aclose` has shut down ("cannot schedule new futures after shutdown" in the server log)."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from duetaspan.adapters.asr.base import NullASR
from duetaspan.router.capture import QuestionCapture


class SlowVoiceDetector:
    """A detector that takes a while per window, so fed chunks queue behind the capture's lock."""

    window = 512

    def confidence(self, window: np.ndarray) -> float:
        time.sleep(0.02)
        return 0.0


async def test_chunks_queued_at_hang_up_are_dropped_without_errors():
    capture = QuestionCapture(NullASR(), vad=SlowVoiceDetector())
    chunk = np.zeros(1920, np.float32)  # 80 ms at 24 kHz -> two VAD windows at 16 kHz
    feeds = [asyncio.ensure_future(capture.feed(chunk, 24000, 0.08 * i)) for i in range(8)]
    await asyncio.sleep(0.01)  # the first chunk is on the VAD thread, the others wait for the lock
    await capture.aclose()
    results = await asyncio.gather(*feeds, return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    await capture.feed(chunk, 24000, 1.0)  # feeding a closed capture is a no-op
