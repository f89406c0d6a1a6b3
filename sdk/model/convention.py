"""The sequence convention of DuetaSpan / PersonaPlex / Moshi: stream layout, special ids, delays, codes.

This is the one module every other part imports for these numbers; nothing else spells them out.

Example:
    >>> from duetaspan.model.convention import RET_ID, SPAN_OPEN_ID, N_STREAMS
    >>> (RET_ID, SPAN_OPEN_ID, N_STREAMS)
    (4, 12, 17)
"""

from __future__ import annotations

from typing import Final

SAMPLE_RATE: Final = 24_000
FRAME_RATE: Final = 12.5
FRAME_SIZE: Final = 1920  # samples per 80 ms frame at 24 kHz
FRAME_MS: Final = 80.0

N_AUDIO_CODEBOOKS: Final = 8  # per speaker
N_STREAMS: Final = 1 + 2 * N_AUDIO_CODEBOOKS  # row 0 text, 1-8 agent audio, 9-16 user audio
TEXT_ROW: Final = 0
AGENT_ROWS: Final = slice(1, 1 + N_AUDIO_CODEBOOKS)
USER_ROWS: Final = slice(1 + N_AUDIO_CODEBOOKS, N_STREAMS)

# Per-stream acoustic delays: text and both semantic codebooks at 0, every acoustic codebook at 1.
DELAYS: Final = (0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1)

# Text ids.
TEXT_EPAD_ID: Final = 0
TEXT_BOS_ID: Final = 1
TEXT_EOS_ID: Final = 2
TEXT_PAD_ID: Final = 3
RET_ID: Final = 4  # `<ret>`: the model asks for a Context Span (SentencePiece piece `<0x00>`)
SPAN_OPEN_ID: Final = 12  # piece `<0x08>`
SPAN_CLOSE_ID: Final = 13  # piece `<0x09>`; checkpoints trained before 2026-09-08 closed with 12
# ids never rendered as agent text
NON_TEXT_IDS: Final = frozenset({0, 1, 2, TEXT_PAD_ID, RET_ID, SPAN_OPEN_ID, SPAN_CLOSE_ID})

# Initial ("beginning of stream") token ids: one past the vocabulary.
AUDIO_CARD: Final = 2048
TEXT_CARD: Final = 32_000
AUDIO_INITIAL_ID: Final = AUDIO_CARD
TEXT_INITIAL_ID: Final = TEXT_CARD
ZERO_TOKEN_ID: Final = -1  # embeds to an exact zero vector
UNGENERATED_TOKEN_ID: Final = -2  # ring slot not generated yet / slot warming up

# Mimi codes written on the agent rows (a silent frame) and the user rows (PersonaPlex's 440 Hz sine) during
# prompts and spans.
SILENCE_CODES: Final = (948, 243, 1178, 546, 1736, 1030, 1978, 2008)
SINE_CODES: Final = (430, 1268, 381, 1611, 1095, 1495, 56, 472)
# The text and 8 agent codes of a frame in which the agent says nothing: what a held slot writes as its own.
SILENT_AGENT_TOKENS: Final = (TEXT_PAD_ID, *SILENCE_CODES)

PROMPT_SILENCE_FRAMES: Final = 6
VOICE_PROMPT_LUFS: Final = -24.0
CONTEXT_FRAMES: Final = 3000  # the 7B temporal transformer's attention window (240 s)


def wrap_system_prompt(text: str) -> str:
    """Wrap a persona text in `<system>` tags the way PersonaPlex was trained.

    >>> wrap_system_prompt("You are Ada.")
    '<system> You are Ada. <system>'
    >>> wrap_system_prompt("<system> hi <system>")
    '<system> hi <system>'
    """
    text = text.strip()
    if text.startswith("<system>") and text.endswith("<system>"):
        return text
    return f"<system> {text} <system>"
