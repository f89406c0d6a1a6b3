"""What `serve` runs after calls (`open_after_call`): the server's `AfterCall` with the store (the agent's, else
opened here from `[store]`), the signing secrets (a server with `[webhooks] urls` and no
`$DUETASPAN_WEBHOOK_SECRET` refuses to start), the analysing LLM (`[router]`'s endpoint and model with
`[analysis] timeout_s`), and redaction of logs and traces under `[privacy] redact`."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from duetaspan.config import AgentConfig
from duetaspan.errors import ConfigError
from duetaspan.webhooks.delivery import DeliveryStats
from duetaspan.webhooks.redact import RedactingLogRecords, Redactor
from duetaspan.webhooks.signing import SECRET_ENV, secrets_from_env

log = logging.getLogger(__name__)


class WebhookCollector:
    """`/metrics`: the outbox's backlog and dead letters, deliveries and failed attempts by reason."""

    def __init__(self, stats: DeliveryStats) -> None:
        self.stats = stats

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield GaugeMetricFamily(
            "duetaspan_webhook_backlog", "Webhook events waiting in the outbox.", value=self.stats.backlog
        )
        yield GaugeMetricFamily(
            "duetaspan_webhook_dead", "Webhook events given up on (dead letters).", value=self.stats.dead_letters
        )
        yield CounterMetricFamily(
            "duetaspan_webhook_delivered", "Webhook events delivered by this server.", value=self.stats.delivered
        )
        failures = CounterMetricFamily(
            "duetaspan_webhook_failures", "Failed webhook delivery attempts by reason.", labels=["reason"]
        )
        for reason, n in sorted(self.stats.by_reason.items()):
            failures.add_metric([reason], n)
        yield failures


def privacy_redactor(config: AgentConfig) -> Redactor | None:
    """The redactor of `[privacy] redact` (None when nothing is redacted)."""
    kinds = config.privacy.redact
    return Redactor(kinds, region=config.privacy.phone_region) if kinds else None


class ServedAfterCall:
    """What `serve` holds: the `AfterCall`, the store it opened (closed at the end), the log hook."""

    def __init__(
        self,
        agent: Any,
        after_call: Any,
        store: Any,
        owns_store: bool,
        logs: RedactingLogRecords | None,
        sweeper: asyncio.Task[None] | None = None,
    ) -> None:
        self.agent, self.after_call, self.store, self.owns_store = agent, after_call, store, owns_store
        self.logs, self.sweeper = logs, sweeper

    async def aclose(self) -> None:
        if self.sweeper is not None:
            self.sweeper.cancel()
            await asyncio.gather(self.sweeper, return_exceptions=True)
        if self.after_call is not None:
            self.agent.after_call = None
            await self.after_call.stop()
        if self.owns_store:
            await self.store.close()
        if self.logs is not None:
            self.logs.uninstall()


async def open_after_call(
    agent: Any, observability: Any = None, env: Mapping[str, str] | None = None
) -> ServedAfterCall | None:
    """The server's after-call work, or None when there is none to do (no webhooks, no analysis, no store)."""
    from duetaspan.store import open_store, store_target
    from duetaspan.webhooks.lifecycle import AfterCall

    config: AgentConfig = agent.config
    env = os.environ if env is None else env
    secrets = secrets_from_env(env)
    if config.webhooks.urls and not secrets:
        raise ConfigError(f"[webhooks] urls is set but ${SECRET_ENV} is not: every delivery is signed")
    redactor = privacy_redactor(config)
    if config.recording.consent != "off":  # rendered once, before the first call (a TTS command is slow)
        from duetaspan.webhooks.consent import load_notice

        agent.consent_notice = await asyncio.to_thread(load_notice, config.recording)
    logs = None
    if redactor is not None:
        logs = RedactingLogRecords(redactor)
        logs.install()
        tracing = getattr(observability, "tracing", None)
        if tracing is not None:
            tracing.redact = redactor.redact
    store, owns = getattr(agent, "store", None), False
    retention = config.recording.retain_days or config.recording.records_retain_days
    wanted = config.webhooks.urls or config.analysis.enabled or retention
    if store is None and wanted:
        data_dir = getattr(config.server, "data_dir", None) or config.base_dir / "data"
        store = await open_store(store_target(config.store.url, config.store.path, data_dir, dict(env)))
        owns = True
    if store is None:
        return ServedAfterCall(agent, None, None, False, logs) if logs else None
    analyzer, llm = None, None
    if config.analysis.enabled:
        from duetaspan.adapters.llm import ChatClient
        from duetaspan.webhooks.analysis import Analyzer

        analyzer = Analyzer.from_config(config.analysis)
        r = config.router
        llm = ChatClient(r.base_url, r.model, api_key=r.api_key(), timeout_s=config.analysis.timeout_s,
                         temperature=0.0, max_tokens=max(1024, r.max_tokens))  # fmt: skip
    after_call = AfterCall(
        store, webhooks=config.webhooks, secrets=secrets, analyzer=analyzer, llm=llm, redactor=redactor,
        transfer_targets=config.tools.settings.transfer_targets,
    )
    after_call.start()
    agent.after_call = after_call
    if getattr(agent, "record_dir", None) is not None:  # calls a killed process left open: finished, indexed
        after_call.finish_abandoned(Path(agent.record_dir))
    sweeper = None
    if retention or not config.webhooks.urls:  # without URLs: the outbox events nobody sends are swept too
        from duetaspan.webhooks.retention import sweep_forever

        record_dir = getattr(agent, "record_dir", None)
        sweep = sweep_forever(store, record_dir, config.recording, webhooks=config.webhooks)
        sweeper = asyncio.create_task(sweep, name="retention-sweeper")
    metrics = getattr(observability, "metrics", None)
    if metrics is not None and after_call.deliverer is not None:
        metrics.registry.register(WebhookCollector(after_call.deliverer.stats))
    return ServedAfterCall(agent, after_call, store, owns, logs, sweeper)


__all__ = ["ServedAfterCall", "open_after_call", "privacy_redactor"]
