"""What an agent's calls share beside the engine: the router and ASR clients (built at start, closed at
stop), the log redaction of `[privacy] redact`, and each call's retrieval on them (`RouterRetrieval`, or
`CallerListener` without a router)."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any
from urllib.parse import urlsplit

from duetaspan.config import AgentConfig
from duetaspan.pipeline.service import RetrievalFactory
from duetaspan.registry import CallContext, ToolRegistry

logger = logging.getLogger("duetaspan.agent")
_LOCAL_HOSTS = ("localhost", "::1")


def router_asr_config(config: AgentConfig) -> Any:
    """The ASR config the router's question capture uses: with `kind = "openai"` and no `url`, transcription
    goes to the router's `base_url` and, unless `[asr] api_key_env` is set, with the router's key variable."""
    asr_cfg = config.asr
    if asr_cfg.kind == "openai" and not asr_cfg.url:
        update: dict[str, Any] = {"url": config.router.base_url}
        if "api_key_env" not in asr_cfg.model_fields_set:
            update["api_key_env"] = config.router.api_key_env
        asr_cfg = asr_cfg.model_copy(update=update)
    return asr_cfg


def _local(url: str | None) -> bool:
    """A loopback endpoint (a server on this machine usually wants no key)."""
    host = (urlsplit(url or "").hostname or "").lower()
    return host in _LOCAL_HOSTS or host.startswith("127.")


def missing_key_warnings(config: AgentConfig, asr_cfg: Any) -> list[str]:
    """One line per key variable the router or its ASR names that is unset (loopback endpoints excepted)."""
    checks = [("router", config.router.api_key_env, config.router.base_url)]
    if asr_cfg.kind in ("openai", "transcribe"):
        checks.append(("asr", asr_cfg.api_key_env, asr_cfg.url))
    lines: list[str] = []
    seen: set[str] = set()
    for section, env, url in checks:
        if not env or os.environ.get(env) or env in seen or _local(url):
            continue
        seen.add(env)
        lines.append(
            f"[{section}] api_key_env {env} is not set: the model's own <ret> will get no span; "
            "the tool console still works"
        )
    return lines


def asr_configured(config: AgentConfig) -> bool:
    """An ASR the agent can reach without the router: an explicit `asr.url`, or in-process whisper."""
    asr = config.asr
    return asr.kind == "whisper" or (asr.kind in ("openai", "transcribe") and bool(asr.url))


def start_shared_clients(
    shared: dict[str, Any], config: AgentConfig, registry: ToolRegistry, *, retrieval_enabled: bool
) -> None:
    """Put the router and ASR clients all calls share into `shared` (`"router"`, `"asr"`).

    With `asr.kind = "openai"` and no `asr.url`, transcription goes to the router's base URL (OpenAI and
    most OpenAI-compatible servers serve `/audio/transcriptions` beside `/chat/completions`) with the
    router's key variable (`router_asr_config`). A key variable that is unset is logged once here. Without
    retrieval an ASR is still built when `asr_configured`: calls then report the caller's turns and
    transcripts (`CallerListener`) without retrieval. Each client lands in `shared` as soon as it exists,
    so `close_shared_clients` closes it when a later one fails.
    """
    if not retrieval_enabled:
        if asr_configured(config):  # no router, but the caller's turns and transcripts all the same
            from duetaspan.adapters.asr import asr_from_config

            shared["asr"] = asr_from_config(config.asr)
        return  # neither the ASR adapters nor the router load (their port is in duetaspan.router)
    from duetaspan.adapters.asr import asr_from_config
    from duetaspan.adapters.llm import ChatClient
    from duetaspan.router import Router
    from duetaspan.router.policy import SideEffectPolicy

    asr_cfg = router_asr_config(config)
    for line in missing_key_warnings(config, asr_cfg):  # once per start, before any call can miss a span
        logger.warning(line)
    shared["asr"] = asr_from_config(asr_cfg)
    # the agent is the composition root: it picks the chat adapter; the router knows only its ChatModel port
    shared["router"] = Router(
        registry,
        ChatClient.from_config(config.router),
        mode=config.router.mode,
        max_reference_chars=4 * config.retrieval.max_reference_tokens,
        policy=SideEffectPolicy.from_config(
            config.router.side_effects, default_mode=config.router.side_effect_mode()
        ),
    )


def redact_logs(shared: dict[str, Any], config: AgentConfig) -> None:
    """`[privacy] redact`: every log line of the process redacted while the agent runs, outside `serve` too (an
    agent used from Python, the testing harness); kept in `shared`, so `close_shared_clients` takes it out."""
    from duetaspan.webhooks.redact import RedactingLogRecords
    from duetaspan.webhooks.served import privacy_redactor

    redactor = privacy_redactor(config)
    if redactor is not None:
        logs = RedactingLogRecords(redactor)
        logs.install()
        shared["log_redaction"] = logs


async def close_shared_clients(shared: dict[str, Any]) -> None:
    """Close the router (its LLM client) and ASR, whichever of `aclose` / `close` they have, and forget them."""
    for client in shared.values():
        close = getattr(client, "aclose", None) or getattr(client, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result
    shared.clear()


def call_retrieval(
    config: AgentConfig, shared: dict[str, Any], context: CallContext, *, retrieval_enabled: bool
) -> RetrievalFactory | None:
    """A call's retrieval on the shared clients: the router's question capture + retrieval manager, or
    without retrieval the caller's turns and transcripts only (None without an ASR either)."""
    if not retrieval_enabled:
        if "asr" not in shared:
            return None
        from duetaspan.pipeline.retrieval import CallerListener

        return CallerListener.factory(shared["asr"], capture=config.capture)
    from duetaspan.pipeline.retrieval import RouterRetrieval

    return RouterRetrieval.factory(
        shared["router"],
        shared["asr"],
        ctx=context,
        capture=config.capture,
        retrieval=config.retrieval,
    )


__all__ = [
    "asr_configured",
    "call_retrieval",
    "close_shared_clients",
    "missing_key_warnings",
    "redact_logs",
    "router_asr_config",
    "start_shared_clients",
]
