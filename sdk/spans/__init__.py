"""Context Spans: the reference contract, span blocks, `<ret>` events and gate, the span queue, persona pinning."""

from duetaspan.spans.block import persona_text_frames, span_frames
from duetaspan.spans.events import RetEvent, RetGate, SpanLanded
from duetaspan.spans.pending import QueuedSpan, SpanQueue
from duetaspan.spans.pinning import PersonaPin
from duetaspan.spans.reference import (
    DEFAULT_MAX_TOKENS,
    NO_INFORMATION,
    TOOL_RESULT_PREFIX,
    PreparedReference,
    normalize_reference,
    prepare_reference,
    tool_result,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "NO_INFORMATION",
    "TOOL_RESULT_PREFIX",
    "PersonaPin",
    "PreparedReference",
    "QueuedSpan",
    "RetEvent",
    "RetGate",
    "SpanLanded",
    "SpanQueue",
    "normalize_reference",
    "persona_text_frames",
    "prepare_reference",
    "span_frames",
    "tool_result",
]
