"""Question capture under overload and at hang-up (both found by the load test, issue #9).

- Overload: when the VAD (or the event loop) is slower than the audio arrives, feeds must not pile up one
  task and one VAD round trip per 80 ms chunk (24k live tasks and +600 MB RSS after 2 minutes of 20 calls on
  2 cores): one scorer catches up on everything written meanwhile in one batch.
- Hang-up: chunks still arriving when the call closes are dropped quietly instead of failing on the VAD
  thread that `aclose` has shut down ("cannot schedule new futures after shutdown" in the server log).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from duetaspan.adapters.asr.base import NullASR
from duetaspan.router.capture import QuestionCapture


class SlowVoiceDetector:
    """A detector that takes a while per window, so chunks arrive faster than they are scored."""

    window = 512

    def __init__(self) -> None:
        self.windows = 0

    def confidence(self, window: np.ndarray) -> float:
        time.sleep(0.02)
        self.windows += 1
        return 0.0


async def test_a_slow_vad_scores_the_backlog_in_batches_without_piling_up_feeds():
    vad = SlowVoiceDetector()
    capture = QuestionCapture(NullASR(), vad=vad)
    chunk = np.zeros(1920, np.float32)  # 80 ms at 24 kHz = 1280 samples at 16 kHz
    feeds = [asyncio.ensure_future(capture.feed(chunk, 24000, 0.08 * i)) for i in range(50)]
    await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    # every feed but the one scoring has already returned: nothing waits in line
    assert sum(not f.done() for f in feeds) <= 1
    await asyncio.gather(*feeds)
    await capture.feed(chunk, 24000, 4.0)  # drives the scorer to the end of what was written
    assert capture._scored == (51 * 1280 // 512) * 512  # every whole window scored, in order
    assert vad.windows == 51 * 1280 // 512
    await capture.aclose()


async def test_chunks_queued_at_hang_up_are_dropped_without_errors():
    capture = QuestionCapture(NullASR(), vad=SlowVoiceDetector())
    chunk = np.zeros(1920, np.float32)  # 80 ms at 24 kHz -> two VAD windows at 16 kHz
    feeds = [asyncio.ensure_future(capture.feed(chunk, 24000, 0.08 * i)) for i in range(8)]
    await asyncio.sleep(0.01)  # the first chunk is on the VAD thread, the others wait for the lock
    await capture.aclose()
    results = await asyncio.gather(*feeds, return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    await capture.feed(chunk, 24000, 1.0)  # feeding a closed capture is a no-op
