"""What a server runs beside the model: `[twilio]`, `[webrtc]`, `[server]`, `[tracing]` and `[recording]`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator

from duetaspan.config.base import _Section


class TwilioConfig(_Section):
    """Twilio: credentials by environment variable name, the public URL Twilio reaches, the number.

    `X-Twilio-Signature` is always checked on the webhooks and the stream upgrade: there is no switch to turn
    it off (without it anyone who finds the URL could open calls and run the agent's tools).

    Attributes:
        account_sid_env: environment variable holding the Account SID.
        auth_token_env: environment variable holding the Auth Token (signs webhooks, authenticates REST).
        public_url: the https URL Twilio reaches this server at (signatures are checked against it;
            http is refused: Twilio opens streams over wss only); `serve --public-url` overrides it.
        phone_number: your Twilio number, E.164: the caller ID of `duetaspan call --config` (`--from`
            overrides it).
    """

    account_sid_env: str = "TWILIO_ACCOUNT_SID"
    auth_token_env: str = "TWILIO_AUTH_TOKEN"
    public_url: str | None = None
    phone_number: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "validate_signatures" in data:
            raise ValueError(
                "validate_signatures was removed: Twilio signatures are always checked (an unsigned server "
                "lets anyone open calls and run your tools); delete the line. To test locally, sign requests "
                "with your auth token (twilio.request_validator.RequestValidator.compute_signature)"
            )
        return data


class WebRTCConfig(_Section):
    """The browser demo over WebRTC (served by `serve --webrtc` or `agent.serve(webrtc=True)`).

    Attributes:
        ice_servers: STUN/TURN URLs for both peers (`[]` when browser and server share a machine or LAN).
    """

    ice_servers: list[str] = Field(default_factory=lambda: ["stun:stun.l.google.com:19302"])

    @model_validator(mode="before")
    @classmethod
    def _removed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "enabled" in data:
            raise ValueError(
                "enabled was removed: the transports are chosen where the server starts "
                "(`duetaspan serve --webrtc`, `agent.serve(webrtc=True)`); delete the line"
            )
        return data


class ServerConfig(_Section):
    """Where `duetaspan serve` (and `agent.serve()`) listens; `--host` / `--port` override it.

    Attributes:
        host: interface to bind (`0.0.0.0` for every interface; the default keeps the server local).
        port: TCP port.
        metrics_token: bearer token `GET /metrics` requires (`Authorization: Bearer <token>`);
            `$DUETASPAN_METRICS_TOKEN` takes precedence and keeps the secret out of the file. Unset: `/metrics`
            is refused, except on a server bound to loopback with no public URL (the first-run demo).
        drain_timeout_s: after SIGTERM (or `POST /admin/drain`) live calls get this long to end by themselves
            before the server ends them (`ended_by: "shutdown"`) and exits; match it to your orchestrator's
            grace period (Kubernetes `terminationGracePeriodSeconds`, systemd `TimeoutStopSec`).
        drain_redirect_url: while draining, Twilio calls ringing in are redirected here (`<Redirect>`: another
            server's `/twilio/voice`); unset: they are rejected busy (`<Reject reason="busy"/>`).
        data_dir: the server's own folder (relative to agent.toml), created at start whether or not recording is
            on: the store's SQLite file lives here (`[store] path` unset).
        max_call_s: the longest a call may last, on every transport (SIP, Twilio, WebRTC, your own Pipecat
            pipeline): past it the agent hangs up (`ended_by: "max_duration"`), so a caller who never hangs
            up cannot hold a slot (and a GPU batch row) for ever.
    """

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    metrics_token: SecretStr | None = None
    drain_timeout_s: float = Field(300.0, gt=0)
    drain_redirect_url: str | None = Field(None, pattern=r"^https?://")
    data_dir: Path = Path("data")
    max_call_s: float = Field(3600.0, gt=0)


class TracingConfig(_Section):
    """OpenTelemetry traces of calls (a trace per call, a span per retrieval), exported over OTLP/HTTP.

    Off unless `enabled = true` or the standard `OTEL_EXPORTER_OTLP_ENDPOINT` /
    `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables are set; needs `pip install 'duetaspan[tracing]'`.
    Headers, timeouts and the rest come from the standard `OTEL_*` variables.

    Attributes:
        enabled: export traces.
        endpoint: the OTLP/HTTP traces URL (e.g. `http://collector:4318/v1/traces`); unset: the `OTEL_*`
            variables, else `http://localhost:4318/v1/traces`.
        service_name: `service.name` of the traces (`$OTEL_SERVICE_NAME` overrides it).
        include_text: put the caller's question and the span's reference text on spans (off: only sizes,
            timings, tool names and redacted arguments).
    """

    enabled: bool = False
    endpoint: str | None = None
    service_name: str = "duetaspan"
    include_text: bool = False


class RecordingConfig(_Section):
    """Per-call artifacts: the stereo wav and the JSON event log.

    Attributes:
        enabled: write `<call id>.wav`, `.jsonl` and `.json` per call (`--record-dir` turns it on).
        dir: the folder (relative to agent.toml).
        audio: write the stereo wav (left caller, right agent) besides the event log; `false` keeps only the
            `.jsonl` / `.json` (no caller audio on disk).
        consent: `"off"`; `"announce"`: the notice is played first, word for word (`consent_audio`, else
            `consent_text` through `consent_tts_command`); `"ask"`: the same, and a refusal (the caller
            says "no", or presses a `consent_refuse_digits` key) within `consent_window_s` of the notice's
            end means the call is not recorded: the wav written so far is deleted and the record says so
            (`recording.recorded: false`).
        consent_audio: the notice as a wav file (relative to agent.toml), played as it is.
        consent_text: the notice's words, rendered by `consent_tts_command` at start.
        consent_tts_command: renders `consent_text`: `{text}` and `{out}` (a wav path) are substituted.
        consent_refuse_digits: DTMF keys that refuse recording.
        consent_window_s: how long after the notice a refusal still counts.
        retain_days: audio older than this is deleted by the sweeper (unset: kept).
        records_retain_days: JSON records and index rows older than this are deleted (unset: kept).
    """

    enabled: bool = False
    dir: Path = Path("recordings")
    audio: bool = True
    consent: Literal["off", "announce", "ask"] = "off"
    consent_audio: Path | None = None
    consent_text: str | None = None
    consent_tts_command: str | None = None
    consent_refuse_digits: str = Field("2", pattern=r"^[0-9*#]*$")
    consent_window_s: float = Field(8.0, gt=0)
    retain_days: float | None = Field(None, gt=0)
    records_retain_days: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _notice(self) -> RecordingConfig:
        if self.consent != "off" and self.consent_audio is None and not (
            self.consent_text and self.consent_tts_command
        ):  # fmt: skip
            raise ValueError(
                f'consent = "{self.consent}" needs the notice: consent_audio (a wav), or consent_text with '
                "consent_tts_command (the duplex model is not trusted to say a legal notice word for word)"
            )
        return self


__all__ = ["RecordingConfig", "ServerConfig", "TracingConfig", "TwilioConfig", "WebRTCConfig"]
