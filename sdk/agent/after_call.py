"""The agent's side of `duetaspan.webhooks`: each call's record redacted (`[privacy] redact`) and, on a served
agent, followed by the server's `AfterCall` (`agent.after_call`, set by `duetaspan.webhooks.served`: lifecycle
webhooks, the call index, end-of-call analysis)."""

from __future__ import annotations

from typing import Any

from duetaspan.agent.answer import attach_answer_gate
from duetaspan.config import AgentConfig
from duetaspan.pipeline.artifacts import CallRecorder
from duetaspan.pipeline.session import CallInfo
from duetaspan.webhooks.consent import attach_consent, load_notice
from duetaspan.webhooks.served import privacy_redactor


def follow_call(agent: Any, call: CallInfo, service: Any) -> None:
    """A new call's service: gated until who answered is known (`[outbound] detect`, `duetaspan.agent.answer`),
    its recorder redacting and playing the consent notice first; followed by the server's after-call work when
    served."""
    recorder: CallRecorder | None = service.recorder
    config: AgentConfig = agent.config
    gate = attach_answer_gate(agent, call, service, service.context, recorder)
    if gate is not None:
        agent.answers[call.call_id] = gate  # the agent's output gated until the verdict
    if recorder is None:
        return
    after_call = getattr(agent, "after_call", None)
    if after_call is not None:  # with a gate, call.answered waits for its verdict
        after_call.attach(
            recorder, caller=call.caller, called=call.called, transport=call.transport, detect=gate is not None
        )
    elif recorder.redactor is None:
        recorder.redactor = privacy_redactor(config)
    if config.recording.consent != "off":
        if getattr(agent, "consent_notice", None) is None:  # a served agent loads it at start
            agent.consent_notice = load_notice(config.recording)
        attach_consent(service, config.recording, agent.consent_notice)


__all__ = ["follow_call"]
