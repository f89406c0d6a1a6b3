"""The reference contract: what a Context Span may say, normalised and capped the way the model was trained.

The model was trained on three shapes of reference, and the router should produce one of them:
`(tool result) <spoken clause>`, a plain factual sentence, or `(no information found)`. Before tokenising, text
is normalised to what the SentencePiece vocabulary represents well (Unicode NFKC, ASCII quotes and dashes, no
control characters, single spaces) and capped at `max_tokens` (default 250), cutting at the last sentence end,
else the last word boundary, that fits.

Example:
    >>> normalize_reference("  \u201cSunny\u201d \u2014 22\u00b0C\\t today ")
    '"Sunny" - 22°C today'
    >>> tool_result("the weather in Sydney is sunny")
    '(tool result) the weather in Sydney is sunny'
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Protocol

TOOL_RESULT_PREFIX = "(tool result)"
NO_INFORMATION = "(no information found)"
DEFAULT_MAX_TOKENS = 250

_TRANSLATE = str.maketrans(
    {
        "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'",
        "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"', "\u2033": '"', "\u00ab": '"', "\u00bb": '"',
        "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-", "\u2014": "-", "\u2015": "-", "\u2212": "-",
        "\u2026": "...", "\u00a0": " ", "\u2022": "-",
    }
)  # fmt: skip
_SPACES = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")


class Encoder(Protocol):
    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class PreparedReference:
    """A reference ready to become a span: the normalised (maybe cut) text, its token ids, whether it was cut."""

    text: str
    tokens: tuple[int, ...]
    truncated: bool

    @property
    def n_frames(self) -> int:
        """Frames the span occupies: open + tokens + close."""
        return len(self.tokens) + 2 if self.tokens else 0


def tool_result(clause: str) -> str:
    """Wrap a tool's spoken clause in the trained `(tool result) ...` shape (idempotent)."""
    clause = normalize_reference(clause)
    if not clause:
        return f"{TOOL_RESULT_PREFIX} {NO_INFORMATION}"
    return clause if clause.startswith(TOOL_RESULT_PREFIX) else f"{TOOL_RESULT_PREFIX} {clause}"


def normalize_reference(text: str) -> str:
    """NFKC, ASCII quotes/dashes/ellipsis, control and format characters removed, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).translate(_TRANSLATE)
    # control characters (tab, NUL, backspace...) are byte pieces that collide with the stream signals
    kept = [" " if ch.isspace() else ch for ch in text if ch.isspace() or unicodedata.category(ch)[0] != "C"]
    return _SPACES.sub(" ", "".join(kept)).strip()


def prepare_reference(text: str, encoder: Encoder, max_tokens: int = DEFAULT_MAX_TOKENS) -> PreparedReference:
    """Normalise, tokenise and cap a reference. Empty text gives no tokens (and so no span)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    text = normalize_reference(text)
    if not text:
        return PreparedReference("", (), False)
    tokens = encoder.encode(text)
    if len(tokens) <= max_tokens:
        return PreparedReference(text, tuple(tokens), False)
    cut = _cut(text, encoder, max_tokens)
    tokens = encoder.encode(cut)[:max_tokens]
    return PreparedReference(cut, tuple(tokens), True)


def _cut(text: str, encoder: Encoder, max_tokens: int) -> str:
    """The longest prefix ending at a sentence end (else a word end) that encodes within `max_tokens`."""

    def fits(prefix: str) -> bool:
        return len(encoder.encode(prefix)) <= max_tokens

    sentence_ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    for end in reversed(sentence_ends):
        if fits(text[:end]):
            return text[:end].strip()
    word_ends = [m.start() for m in re.finditer(r" ", text)]
    # binary search over word boundaries: token counts grow with the prefix
    lo, hi, best = 0, len(word_ends) - 1, ""
    while lo <= hi:
        mid = (lo + hi) // 2
        prefix = text[: word_ends[mid]].strip()
        if fits(prefix):
            best, lo = prefix, mid + 1
        else:
            hi = mid - 1
    return best or text
