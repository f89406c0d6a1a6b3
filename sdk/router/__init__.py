"""The router (`duetaspan.router`): question capture (VAD + ASR), the LLM router prompt and parsing, the
per-call retrieval lifecycle (one in flight, deadline, cancellation) and the per-call Context DB."""

from duetaspan.router.capture import Question, QuestionCapture, SileroVoiceDetector, Utterance, VoiceDetector
from duetaspan.router.context_db import CallerProfile, ContextDB, ContextTurn
from duetaspan.router.events import (
    Delivered,
    LateSpan,
    NoSpan,
    QuestionCaptured,
    ReferenceReady,
    RetReceived,
    RetrievalCancelled,
    RetrievalEvent,
    RetrievalFailed,
    RouterDecided,
    ToolCalled,
)
from duetaspan.router.outcome import CallOutcome
from duetaspan.router.policy import SideEffectPolicy, explicit_request
from duetaspan.router.retrieval import RetrievalManager, RetrievalMeta
from duetaspan.router.router import Router, RouteResult, RouteStep

__all__ = [
    "CallOutcome",
    "CallerProfile",
    "ContextDB",
    "ContextTurn",
    "Delivered",
    "LateSpan",
    "NoSpan",
    "Question",
    "QuestionCapture",
    "QuestionCaptured",
    "ReferenceReady",
    "RetReceived",
    "RetrievalCancelled",
    "RetrievalEvent",
    "RetrievalFailed",
    "RetrievalManager",
    "RetrievalMeta",
    "RouteResult",
    "RouteStep",
    "Router",
    "RouterDecided",
    "SideEffectPolicy",
    "SileroVoiceDetector",
    "ToolCalled",
    "Utterance",
    "VoiceDetector",
    "explicit_request",
]
