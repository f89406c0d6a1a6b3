"""The webhook signature contract: `Duetaspan-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of "<t>.<body>">`,
checked by `duetaspan.webhooks.verify` (bad signature, old timestamp, rotation with two secrets)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from duetaspan.webhooks import HEADER, SignatureError, signature_header, verify
from duetaspan.webhooks.signing import secrets_from_env

BODY = (
    b'{"id":"evt_1","type":"call.ended","created":1700000000,"call_id":"CA1","data":{"outcome":"completed"}}'
)
NOW = 1_700_000_000


def test_header_is_the_documented_hmac_of_timestamp_dot_body():
    header = signature_header(BODY, ["whsec"], timestamp=NOW)
    expected = hmac.new(b"whsec", f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert HEADER == "Duetaspan-Signature"
    assert header == f"t={NOW},v1={expected}"


def test_verify_accepts_a_good_delivery_and_returns_the_body():
    header = signature_header(BODY, ["whsec"], timestamp=NOW)
    assert verify(BODY, header, "whsec", now=NOW + 299) == json.loads(BODY)
    assert verify(BODY.decode(), header, b"whsec", now=NOW - 10)["call_id"] == "CA1"


@pytest.mark.parametrize(
    "body, header, secret",
    [
        (BODY, None, "whsec"),  # no header
        (BODY, "garbage", "whsec"),  # malformed
        (BODY, f"t={NOW}", "whsec"),  # no signature
        (BODY, "t=soon,v1=00", "whsec"),  # not a timestamp
        (BODY, "SIGNED-WITH-OTHER", "whsec"),  # another secret
        (BODY.replace(b"completed", b"failed"), "SIGNED", "whsec"),  # body changed after signing
        (b'{"id": "evt_1"}', "SIGNED", "whsec"),  # re-serialized body
        (BODY, "SIGNED", ""),  # no secret to check with
    ],
)
def test_verify_refuses_bad_signatures(body, header, secret):
    if header == "SIGNED":
        header = signature_header(BODY, ["whsec"], timestamp=NOW)
    elif header == "SIGNED-WITH-OTHER":
        header = signature_header(BODY, ["other"], timestamp=NOW)
    with pytest.raises(SignatureError):
        verify(body, header, secret, now=NOW)


def test_verify_refuses_old_and_future_timestamps():
    header = signature_header(BODY, ["whsec"], timestamp=NOW)
    with pytest.raises(SignatureError, match="replayed"):
        verify(BODY, header, "whsec", now=NOW + 301)
    with pytest.raises(SignatureError):
        verify(BODY, header, "whsec", now=NOW - 301)
    assert verify(BODY, header, "whsec", tolerance_s=3600, now=NOW + 3000)["id"] == "evt_1"


def test_rotation_one_v1_per_secret_and_receivers_accept_either():
    secrets = secrets_from_env(
        {"DUETASPAN_WEBHOOK_SECRET": "new", "DUETASPAN_WEBHOOK_SECRET_PREVIOUS": "old"}
    )
    assert secrets == ["new", "old"]
    header = signature_header(BODY, secrets, timestamp=NOW)
    assert header.count("v1=") == 2 and header.startswith(f"t={NOW},v1=")
    assert verify(BODY, header, "old", now=NOW)["id"] == "evt_1"  # a receiver not yet updated
    assert verify(BODY, header, "new", now=NOW)["id"] == "evt_1"  # an updated one
    assert verify(BODY, header, ["newest", "new"], now=NOW)["id"] == "evt_1"  # a receiver mid-rotation
    with pytest.raises(SignatureError):
        verify(BODY, header, "neither", now=NOW)
    assert secrets_from_env({"DUETASPAN_WEBHOOK_SECRET": "only"}) == ["only"]
    with pytest.raises(SignatureError):
        signature_header(BODY, [])
