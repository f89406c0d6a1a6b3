"""`[sip] outbound_proxy` and `ring_timeout_s`: what the setting accepts, the clear error for what it does
not (checked before the model loads), and the loose route the INVITEs then carry."""

from __future__ import annotations

import pytest

from duetaspan.adapters.sip.proxy import route_uri
from duetaspan.adapters.sip.serve import sip_settings
from duetaspan.config import AgentConfig
from duetaspan.config.sip import parse_proxy
from duetaspan.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "parsed", "route"),
    [
        ("sip.trunk.example", ("sip.trunk.example", 5060, None), "<sip:sip.trunk.example:5060;lr>"),
        ("10.0.0.7:5080", ("10.0.0.7", 5080, None), "<sip:10.0.0.7:5080;lr>"),
        (
            "pbx.example:5060;transport=udp",
            ("pbx.example", 5060, "udp"),
            "<sip:pbx.example:5060;transport=udp;lr>",
        ),
        ("[2001:db8::1]:5062", ("2001:db8::1", 5062, None), "<sip:[2001:db8::1]:5062;lr>"),
    ],
)
def test_outbound_proxy_values_and_their_route(value, parsed, route):
    assert parse_proxy(value) == parsed
    assert route_uri(value) == route


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("trunk.example:fifty", "the port must be a number"),
        ("trunk.example:70000", "is not a port"),
        ("trunk.example;lr", "only ;transport=udp|tcp|tls"),
        ("user@trunk.example", "expected host[:port]"),
        ("trunk.example;transport=tls", "transport must be the endpoint's own"),
    ],
)
def test_bad_outbound_proxy_fails_before_the_model_loads(tmp_path, value, says):
    path = tmp_path / "agent.toml"
    path.write_text(f'[sip]\noutbound_proxy = "{value}"\n')
    with pytest.raises(ConfigError, match="outbound_proxy") as err:
        sip_settings(AgentConfig.load(path), True, host="127.0.0.1", env={})
    assert says in str(err.value)


def test_proxy_ring_timeout_and_trunk_password_reach_the_endpoint(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text('[sip]\noutbound_proxy = "trunk.example:5080"\nuser = "7001"\nring_timeout_s = 12\n')
    settings = sip_settings(
        AgentConfig.load(path), True, host="127.0.0.1", env={"DUETASPAN_SIP_PASSWORD": "pw"}
    )
    assert (settings.outbound_proxy, settings.ring_timeout_s) == ("trunk.example:5080", 12.0)
    assert (settings.user, settings.register_password) == ("7001", "pw")
    assert "pw" not in repr(settings)
