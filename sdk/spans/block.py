"""Span blocks: the `[17, n]` token columns a Context Span (or a pinned persona text) writes into the streams.

Columns are in undelayed (time-aligned) coordinates; the LM's one-pass `prefill` applies the acoustic delays
at both boundaries. A reference span is text `[SPAN_OPEN] + tokens + [close]` with the agent rows on
`SILENCE_CODES` and the user rows on `SINE_CODES`; the persona text block is PersonaPlex's prompt layout
(silence, one text token per frame, silence) with PAD text on the silence frames.

Example:
    >>> span_frames([101, 102]).shape
    torch.Size([17, 4])
    >>> span_frames([101, 102])[0].tolist()
    [12, 101, 102, 13]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from duetaspan.model.convention import (
    AGENT_ROWS,
    N_STREAMS,
    PROMPT_SILENCE_FRAMES,
    SILENCE_CODES,
    SINE_CODES,
    SPAN_CLOSE_ID,
    SPAN_OPEN_ID,
    TEXT_PAD_ID,
    TEXT_ROW,
    USER_ROWS,
)


def placeholder_frames(text: Sequence[int]) -> torch.Tensor:
    """`[17, len(text)]` columns: the given text ids, agent = silence codes, user = sine codes."""
    frames = torch.empty(N_STREAMS, len(text), dtype=torch.long)
    frames[TEXT_ROW] = torch.as_tensor(list(text), dtype=torch.long)
    frames[AGENT_ROWS] = torch.tensor(SILENCE_CODES, dtype=torch.long)[:, None]
    frames[USER_ROWS] = torch.tensor(SINE_CODES, dtype=torch.long)[:, None]
    return frames


def span_frames(tokens: Sequence[int], close_id: int = SPAN_CLOSE_ID) -> torch.Tensor:
    """A Context Span block of `len(tokens) + 2` frames (close id 12 for checkpoints trained before 2026-09-08)."""
    return placeholder_frames([SPAN_OPEN_ID, *tokens, close_id])


def persona_text_frames(tokens: Sequence[int], silence_frames: int = PROMPT_SILENCE_FRAMES) -> torch.Tensor:
    """PersonaPlex's text-prompt section: `silence` PAD frames, one frame per token, `silence` PAD frames."""
    pad = [TEXT_PAD_ID] * silence_frames
    return placeholder_frames([*pad, *tokens, *pad])
