"""The agent's side of `duetaspan.webhooks`: each call's record redacted (`[privacy] redact`) and, on a served
agent, followed by the server's `AfterCall` (`agent.after_call`, set by `duetaspan.webhooks.served`: lifecycle
webhooks, the call index, end-of-call analysis)."""

from __future__ import annotations

from typing import Any

from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.session import CallInfo
from duetaspan.webhooks.served import privacy_redactor


def follow_call(agent: Any, call: CallInfo, recorder: CallRecorder | None) -> None:
    """A new call's recorder: redacting, and followed by the server's after-call work when served."""
    if recorder is None:
        return
    after_call = getattr(agent, "after_call", None)
    if after_call is not None:
        after_call.attach(recorder, caller=call.caller, called=call.called, transport=call.transport)
    elif recorder.redactor is None:
        recorder.redactor = privacy_redactor(agent.config)


__all__ = ["follow_call"]
