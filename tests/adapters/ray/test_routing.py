"""The sealed stream token (any ingress replica can check it; nobody else can make the ingress connect
anywhere), the deployment settings Serve gets, and `serve --ray` argument checks; no Ray needed."""

from __future__ import annotations

import argparse

import pytest

from duetaspan.adapters.ray.config import RayServeConfig, ReplicaOptions
from duetaspan.adapters.ray.routing import CallRoute, open_token, seal
from duetaspan.adapters.twilio.errors import TokenExpired, TokenUnknown
from duetaspan.adapters.twilio.rest import TwilioCredentials
from duetaspan.errors import ConfigError

KEY = b"0123456789abcdef0123456789abcdef"
ROUTE = CallRoute(relay_url="ws://10.1.2.3:4567/relay/tok", call_sid="CA1", replica="r1", expires_at=1000.0)


def test_sealed_token_round_trips_and_is_path_safe():
    token = seal(ROUTE, KEY)
    assert open_token(token, KEY, now=999.0) == ROUTE
    assert all(c.isalnum() or c in "-_" for c in token)  # one path segment, redactable in logs


def test_altered_foreign_and_expired_tokens_are_refused():
    token = seal(ROUTE, KEY)
    other = seal(ROUTE.model_copy(update={"relay_url": "ws://evil.example/x"}), KEY)
    forged = other[:-43] + token[-43:]  # someone else's route under our seal
    with pytest.raises(TokenUnknown):
        open_token(forged, KEY, now=0.0)
    with pytest.raises(TokenUnknown):
        open_token(token, b"another key" * 3, now=0.0)
    with pytest.raises(TokenUnknown):
        open_token("short", KEY, now=0.0)
    with pytest.raises(TokenExpired):
        open_token(token, KEY, now=1000.5)


def test_autoscaling_targets_slot_occupancy():
    r = ReplicaOptions(max_calls=8, min_replicas=2, max_replicas=6, target_occupancy=0.75)
    auto = r.autoscaling()
    assert auto["target_ongoing_requests"] == 6.0
    assert (auto["min_replicas"], auto["max_replicas"]) == (2, 6)
    with pytest.raises(ValueError, match="max_replicas"):
        ReplicaOptions(min_replicas=3, max_replicas=2)


def _args(**kw) -> argparse.Namespace:
    base = dict(
        twilio=True, webrtc=False, public_url="https://agent.example.test", config=None, model="tiny-random",
        device="cpu", record_dir=None, no_retrieval=True, max_calls=3, ray_address=None, min_replicas=2,
        max_replicas=None, gpus_per_replica=None, cpus_per_replica=0.5,
    )  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_cli_flags_map_onto_the_deployment(monkeypatch):
    from duetaspan.adapters.ray.cli import config_from_cli

    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC1")
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "secret")
    cfg = config_from_cli(_args())
    assert isinstance(cfg, RayServeConfig)
    assert (cfg.replica.max_calls, cfg.replica.num_gpus, cfg.replica.num_cpus) == (3, 0.0, 0.5)
    assert (cfg.replica.min_replicas, cfg.replica.max_replicas) == (2, 2)
    assert cfg.agent.overrides() == {"model": "tiny-random", "device": "cpu", "router": False}
    assert not cfg.local_demo  # a public URL: /metrics and /admin/* need their tokens
    assert config_from_cli(_args(device=None, max_replicas=5)).replica.num_gpus == 1.0
    assert config_from_cli(_args(engine_process=True)).agent.overrides()["engine_process"] is True
    for bad, match in (
        ({"twilio": False}, "--twilio"),
        ({"public_url": None}, "--public-url"),
        ({"max_replicas": 1, "min_replicas": 0, "max_calls": 0}, None),
    ):
        if match is None:
            assert config_from_cli(_args(**bad)).replica.max_calls == 4  # 0: the default slots
            continue
        with pytest.raises(ConfigError, match=match):
            config_from_cli(_args(**bad))


def test_cli_webrtc_alone_or_with_twilio_shares_one_page_token(monkeypatch):
    from duetaspan.adapters.ray.cli import config_from_cli

    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC1")
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "secret")
    monkeypatch.delenv("DUETASPAN_WEBRTC_TOKEN", raising=False)
    alone = config_from_cli(_args(twilio=False, webrtc=True, public_url=None, allow_force_ret=True))
    assert not alone.twilio and alone.credentials is None and alone.webrtc.allow_force_ret
    assert alone.local_demo  # loopback, no public URL: the first-run demo
    assert not config_from_cli(_args(twilio=False, webrtc=True, public_url=None, host="0.0.0.0")).local_demo
    assert (
        len(alone.webrtc.token.get_secret_value()) >= 16
    )  # one random token, in the config every ingress gets
    monkeypatch.setenv("DUETASPAN_WEBRTC_TOKEN", "from-the-environment-0123")
    both = config_from_cli(_args(webrtc=True))
    assert both.twilio and both.webrtc.token.get_secret_value() == "from-the-environment-0123"
    with pytest.raises(ValueError, match="nothing to serve"):
        RayServeConfig()
    with pytest.raises(ValueError, match="token"):
        RayServeConfig(webrtc={"ice_servers": []})


def test_config_pickles_with_the_twilio_secret():
    import pickle

    cfg = RayServeConfig(
        public_url="https://a.example", credentials=TwilioCredentials(account_sid="AC1", auth_token="s3cret")
    )
    again = pickle.loads(pickle.dumps(cfg))
    assert again.credentials.auth_token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(again)


def test_serve_config_file_builder_reads_agent_toml_and_env(tmp_path, monkeypatch):
    """`import_path: duetaspan.adapters.ray.app:app_builder` with `args:` as Serve's config file passes them."""
    pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'duetaspan[ray]')")
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
    from ray.serve.deployment import Application

    from duetaspan.adapters.ray.app import app_builder, config_from_builder_args

    toml = tmp_path / "agent.toml"
    toml.write_text(
        '[persona]\nprompt = "You are Ada."\n\n[model]\npreset = "tiny-random"\n\n[server]\ndrain_timeout_s = 42\n'
    )
    monkeypatch.setenv("DUETASPAN_ADMIN_TOKEN", "admin-from-the-environment")
    monkeypatch.setenv("TWILIO_ACCOUNT_SID", "AC9")
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "tok")
    args = {
        "public_url": "https://agent.example.test",
        "agent_config": str(toml),
        "retrieval": False,
        "replica": {"max_calls": 6, "num_gpus": 1, "min_replicas": 2, "max_replicas": 5},
    }
    cfg = config_from_builder_args(args)
    assert cfg.agent.config.persona.prompt == "You are Ada."
    # a replica drains for [server] drain_timeout_s (Serve's kill deadline is later); the admin token from env
    assert cfg.drain_timeout_s == 42 and cfg.admin_bearer == "admin-from-the-environment"
    assert config_from_builder_args({**args, "replica": {"drain_timeout_s": 7}}).drain_timeout_s == 7
    assert (
        cfg.credentials.account_sid == "AC9" and cfg.replica.autoscaling()["target_ongoing_requests"] == 4.5
    )
    app = call_user_app_builder_with_args_if_necessary(app_builder, args)  # what `serve run/deploy` does
    assert isinstance(app, Application)
    with pytest.raises(ConfigError, match="no such file"):
        config_from_builder_args({**args, "agent_config": str(tmp_path / "missing.toml")})
    monkeypatch.delenv("DUETASPAN_WEBRTC_TOKEN", raising=False)
    page_only = {"agent_config": str(toml), "webrtc": True}
    with pytest.raises(ConfigError, match="DUETASPAN_WEBRTC_TOKEN"):  # ingress replicas must share it
        config_from_builder_args(page_only)
    monkeypatch.setenv("DUETASPAN_WEBRTC_TOKEN", "shared-page-token-0123")
    cfg = config_from_builder_args(page_only)
    assert cfg.credentials is None and cfg.webrtc.token.get_secret_value() == "shared-page-token-0123"
    monkeypatch.delenv("TWILIO_AUTH_TOKEN")
    with pytest.raises(ConfigError):
        config_from_builder_args(args)
