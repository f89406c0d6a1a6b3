"""What `--sip` adds to `duetaspan serve` / `agent.serve(sip=True)`: the flags, the settings resolved from
them and `[sip]` (the digest password only from `$DUETASPAN_SIP_AUTH_PASSWORD`), and the endpoint's life
beside the web server (listening at once, answering 503 until the agent is loaded).

Example:
    duetaspan serve --sip --sip-port 5060 --sip-allow 10.0.0.0/8 --model tiny-random
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from duetaspan.config import AgentConfig
from duetaspan.config.sip import AUTH_PASSWORD_ENV, REGISTER_PASSWORD_ENV
from duetaspan.errors import ConfigError

if TYPE_CHECKING:  # aiosipua/aiortp load only when --sip is used
    from duetaspan.adapters.sip.endpoint import SipEndpoint, SipSettings

OVERRIDES = ("port", "transport", "allow", "host")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--sip*` flags of `duetaspan serve`."""
    parser.add_argument(
        "--sip", action="store_true", help="answer SIP calls (INVITE over UDP/TCP/TLS, RTP media)"
    )
    parser.add_argument("--sip-port", type=int, help="SIP port (default: [sip] port, else 5060)")
    parser.add_argument(
        "--sip-transport", choices=("udp", "tcp", "tls"), help="default: [sip] transport, else udp"
    )
    parser.add_argument(
        "--sip-allow",
        help="comma-separated source networks (CIDR) answered without credentials (default: [sip] allow; "
        "with neither it nor [sip] auth_user only loopback)",
    )


def cli_options(args: argparse.Namespace) -> bool | dict[str, Any]:
    """`--sip*` flags as the `sip=` argument of `agent.serve`: False, True or a dict of overrides."""
    if not getattr(args, "sip", False):
        if any(getattr(args, f"sip_{k}", None) for k in ("port", "transport", "allow")):
            raise ConfigError("--sip-port, --sip-transport and --sip-allow need --sip")
        return False
    options: dict[str, Any] = {}
    if args.sip_port is not None:
        options["port"] = args.sip_port
    if args.sip_transport:
        options["transport"] = args.sip_transport
    if args.sip_allow:
        options["allow"] = [c.strip() for c in args.sip_allow.split(",") if c.strip()]
    return options or True


def sip_settings(
    config: AgentConfig,
    options: bool | Mapping[str, Any],
    *,
    host: str,
    env: Mapping[str, str] | None = None,
) -> SipSettings:
    """The endpoint's settings: `options` (from `sip=`) over `[sip]`, checked before the model loads."""
    from pydantic import ValidationError

    from duetaspan.adapters.sip.endpoint import SipSettings
    from duetaspan.config.base import format_errors
    from duetaspan.config.sip import SipConfig

    env = os.environ if env is None else env
    overrides = dict(options) if isinstance(options, Mapping) else {}
    unknown = sorted(set(overrides) - set(SipConfig.model_fields))
    if unknown:
        raise ConfigError(f"sip=: unknown option(s) {unknown}")
    try:
        cfg = SipConfig.model_validate({**config.sip.model_dump(exclude_unset=True), **overrides})
    except ValidationError as exc:
        raise ConfigError(f"[sip] / --sip-*: {format_errors(exc)}") from None
    password = env.get(AUTH_PASSWORD_ENV) or None
    if cfg.auth_user and not password:
        raise ConfigError(
            f"[sip] auth_user is set but ${AUTH_PASSWORD_ENV} is not: set the digest password there"
        )
    base = config.base_dir

    def path(p: Path | None) -> Path | None:
        return None if p is None else (p if p.is_absolute() else base / p)

    return SipSettings(
        host=cfg.host or host,
        port=cfg.port,
        transport=cfg.transport,
        allow=list(cfg.allow),
        auth_user=cfg.auth_user,
        auth_password=password,
        realm=cfg.realm,
        refuse=cfg.refuse,
        advertised_ip=cfg.advertised_ip,
        rtp_port_min=cfg.rtp_port_min,
        rtp_port_max=cfg.rtp_port_max,
        max_message_bytes=cfg.max_message_bytes,
        rate_per_s=cfg.rate_per_s,
        answer_after_ms=cfg.answer_after_ms,
        media_timeout_s=cfg.media_timeout_s,
        registrar=cfg.registrar,
        user=cfg.user,
        register_password=env.get(REGISTER_PASSWORD_ENV) or None,
        register_expires=cfg.register_expires,
        outbound_proxy=cfg.outbound_proxy,
        ring_timeout_s=cfg.ring_timeout_s,
        tls_cert=path(cfg.tls_cert),
        tls_key=path(cfg.tls_key),
        srtp=cfg.srtp_mode,
        srtp_plain_signalling=cfg.srtp_plain_signalling,
        codecs=tuple(cfg.codecs),
    )


def build_endpoint(settings: SipSettings, agent: Any, metrics: Any) -> SipEndpoint:
    """The endpoint, answering 503 until `agent` has started; refusals are counted in `metrics`."""
    from duetaspan.adapters.sip.bridge import agent_call_handler
    from duetaspan.adapters.sip.endpoint import SipEndpoint

    def slots() -> int:
        runner = getattr(agent, "runner", None)
        return int(runner.max_calls) if runner is not None and runner.running else 0

    endpoint = SipEndpoint(settings, agent_call_handler(agent), max_calls=slots, ready=lambda: agent.started)
    endpoint.shared = getattr(agent, "admission", None)  # one call budget with Twilio, WebRTC, Pipecat; drain
    if metrics is not None:
        endpoint.on_refusal = metrics.sip_refused
        endpoint.on_registration = metrics.sip_registration
    endpoint.on_dial = dial_outcome(agent, metrics)
    if metrics is not None:
        wire_rtp_metrics(endpoint, metrics.sip)
    return endpoint


def wire_rtp_metrics(endpoint: SipEndpoint, sip_metrics: Any) -> None:
    """Each call's RTP figures into `/metrics` (`duetaspan.observability.sip_metrics.SipMetrics`): the counters
    once a second while it runs, the rest and the histograms when it ends."""

    def running(call: Any) -> None:
        sip_metrics.call_rtp(call.quality.figures(), call_id=call.call_sid, final=False)

    def ended(call: Any) -> None:
        sip_metrics.call_rtp(call.quality.figures(), call.quality.rtt_ms, call_id=call.call_sid)

    endpoint.on_call_rtp, endpoint.on_call_end = running, ended


def dial_outcome(agent: Any, metrics: Any) -> Callable[[Any], None]:
    """What happens to every call we place: counted by outcome, and one that was never answered gets its own
    record (an answered one is recorded by its session like any call)."""
    from duetaspan.adapters.sip.records import write_dial_record

    def outcome(result: Any) -> None:
        if metrics is not None:
            metrics.sip.dialled(result.outcome)
        record_dir = getattr(agent, "record_dir", None)
        if result.outcome != "answered" and record_dir is not None:
            write_dial_record(record_dir, result)

    return outcome


__all__ = [
    "OVERRIDES",
    "add_arguments",
    "build_endpoint",
    "cli_options",
    "dial_outcome",
    "sip_settings",
    "wire_rtp_metrics",
]
