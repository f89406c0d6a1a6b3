"""Unit tests of the Twilio adapter's parts: mu-law codec, message validation, tokens, TwiML, REST client."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
from twilio.request_validator import RequestValidator

from duetaspan.adapters.twilio import security, twiml
from duetaspan.adapters.twilio.audio import MulawDecoder, MulawEncoder, int16_to_ulaw, ulaw_to_int16
from duetaspan.adapters.twilio.errors import (
    CallAlreadyAnswered,
    MalformedMessage,
    MessageTooLarge,
    SignatureInvalid,
    TokenExpired,
    TokenReused,
    TokenUnknown,
    TooManyPending,
    TwilioConfigError,
    TwilioRestError,
    UnsupportedMessage,
)
from duetaspan.adapters.twilio.messages import (
    MediaEvent,
    StartEvent,
    UnknownEvent,
    clear_message,
    mark_message,
    parse_message,
)
from duetaspan.adapters.twilio.rest import TwilioCredentials, TwilioRest
from duetaspan.adapters.twilio.security import SigningKeys, StreamTokens, check_signature, url_forms
from duetaspan.adapters.twilio.service import TwilioSettings
from tests.adapters.twilio.peer import ACCOUNT_SID, AUTH_TOKEN, FakeTwilioRest
from tests.support import load_twilio_stream, load_ulaw


def test_mulaw_codec_matches_g711_as_audioop_does():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    x = np.arange(-32768, 32768, dtype=np.int16)
    assert int16_to_ulaw(x) == audioop.lin2ulaw(x.tobytes(), 2)
    every = bytes(range(256))
    assert ulaw_to_int16(every).tobytes() == audioop.ulaw2lin(every, 2)


def test_streaming_codec_round_trip_keeps_length_and_signal():
    ulaw = load_ulaw("greeting")
    dec, enc = MulawDecoder(), MulawEncoder()
    pcm = np.concatenate([dec.decode(ulaw[i : i + 160]) for i in range(0, len(ulaw) - 159, 160)])
    assert abs(len(pcm) - 3 * (len(ulaw) // 160) * 160) < 20  # 24 kHz, no chunk lost
    back = b"".join(enc.encode(pcm[i : i + 1920]) for i in range(0, len(pcm), 1920))
    assert 0 <= (len(ulaw) // 160) * 160 - len(back) < 250  # the encoder holds back its filter delay
    a = ulaw_to_int16(ulaw[8000:24000]).astype(np.float32)  # 1-3 s: speech
    b = ulaw_to_int16(back[8000:24000]).astype(np.float32)
    assert np.corrcoef(a, b)[0, 1] > 0.99  # aligned: the resamplers' delays are held back at the end


def test_inbound_resampler_emits_every_chunk():
    dec = MulawDecoder()
    sizes = [len(dec.decode(b"\xff" * 160)) for _ in range(10)]
    assert min(sizes) > 400  # no 60-140 ms bursts (which VHQ/HQ would add before the model hears)


def test_recorded_messages_parse():
    msgs = [parse_message(__import__("json").dumps(m), 16384) for m in load_twilio_stream("greeting")]
    assert isinstance(msgs[1], StartEvent) and msgs[1].start.media_format.sample_rate == 8000
    media = [m for m in msgs if isinstance(m, MediaEvent)]
    assert all(len(m.audio(1600)) == 160 for m in media)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", MalformedMessage),
        ("[]", MalformedMessage),
        ('{"event": 5}', MalformedMessage),
        ('{"event": "start", "sequenceNumber": "1"}', MalformedMessage),
        ('{"event": "media", "sequenceNumber": "two", "streamSid": "MZ", "media": {}}', MalformedMessage),
        (b"\x00binary", UnsupportedMessage),
        ('{"event": "stop", "pad": "' + "x" * 20000 + '"}', MessageTooLarge),
    ],
)
def test_bad_messages_raise_the_right_error(text, error):
    with pytest.raises(error):
        parse_message(text, 16384)


def test_unknown_event_parses_to_an_ignorable_message():
    """Twilio adds message types: a JSON object with an unknown `event` name is not a protocol error."""
    msg = parse_message('{"event": "teleport", "sequenceNumber": "3", "whatever": [1]}', 16384)
    assert isinstance(msg, UnknownEvent) and msg.event == "teleport"


def test_outbound_messages():
    assert mark_message("MZ1", "a1000") == '{"event":"mark","streamSid":"MZ1","mark":{"name":"a1000"}}'
    assert clear_message("MZ1") == '{"event":"clear","streamSid":"MZ1"}'


def test_tokens_are_single_use_and_expire():
    now = [100.0]
    tokens = StreamTokens(ttl_s=10, clock=lambda: now[0])
    a = tokens.issue(call_sid="CA1", account_sid="AC1")
    b = tokens.issue(call_sid="CA2", account_sid="AC1")
    assert a.token != b.token and tokens.pending == 2
    assert tokens.redeem(a.token).call_sid == "CA1"
    with pytest.raises(TokenReused):
        tokens.redeem(a.token)
    with pytest.raises(TokenUnknown):
        tokens.redeem("nope")
    now[0] += 11
    with pytest.raises(TokenExpired):
        tokens.redeem(b.token)
    assert tokens.pending == 0


def test_one_token_per_call_answered_calls_are_remembered_and_pending_is_bounded():
    now = [0.0]
    tokens = StreamTokens(ttl_s=10, clock=lambda: now[0], max_pending=3, memory=4)
    a = tokens.issue(call_sid="CA1", account_sid="AC1")
    assert tokens.issue(call_sid="CA1", account_sid="AC1") == a  # a replay: the same grant, no new token
    assert tokens.pending == 1 and tokens.waiting("CA1") == a
    tokens.redeem(a.token)
    with pytest.raises(CallAlreadyAnswered):  # the same webhook after its token was used
        tokens.issue(call_sid="CA1", account_sid="AC1")
    tokens.issue(call_sid="CA2", account_sid="AC1")
    now[0] += 11  # CA2's token expires unused: its CallSid stays answered
    with pytest.raises(CallAlreadyAnswered):
        tokens.issue(call_sid="CA2", account_sid="AC1")
    for sid in ("CA3", "CA4", "CA5"):
        tokens.issue(call_sid=sid, account_sid="AC1")
    with pytest.raises(TooManyPending):
        tokens.issue(call_sid="CA6", account_sid="AC1")
    assert not tokens.answered("CA1")  # only the last `memory` CallSids are kept
    assert tokens.answered("CA5")


def test_signature_url_forms_with_and_without_the_default_port():
    assert url_forms("wss://a.example.com/twilio/stream/t") == [
        "wss://a.example.com/twilio/stream/t",
        "wss://a.example.com:443/twilio/stream/t",
    ]
    assert url_forms("https://a.example.com:443/p") == [
        "https://a.example.com:443/p",
        "https://a.example.com/p",
    ]
    assert url_forms("https://a.example.com:8443/p") == ["https://a.example.com:8443/p"]
    keys = SigningKeys(auth_token=AUTH_TOKEN)
    validator = RequestValidator(AUTH_TOKEN)
    params = {"CallSid": "CA1"}
    for signed, checked in [
        ("https://a.example.com:443/twilio/voice", "https://a.example.com/twilio/voice"),
        ("https://a.example.com/twilio/voice", "https://a.example.com:443/twilio/voice"),
        ("wss://a.example.com:443/twilio/stream/t", "wss://a.example.com/twilio/stream/t"),
        ("wss://a.example.com/twilio/stream/t", "wss://a.example.com:443/twilio/stream/t"),
    ]:
        check_signature(keys, checked, params, validator.compute_signature(signed, params))
    with pytest.raises(SignatureInvalid):  # another port is another URL
        check_signature(keys, "https://a.example.com/twilio/voice", params,
                        validator.compute_signature("https://a.example.com:8443/twilio/voice", params))  # fmt: skip


def test_shared_key_signatures():
    url, params = "https://a.example.com/twilio/voice", {"CallSid": "CA1"}
    keys = SigningKeys(
        auth_token=AUTH_TOKEN, shared_key_id="webhooks_sharedkey_1", shared_key_secret="sk-secret"
    )
    settings = "key=webhooks_sharedkey_1,algorithm=HMAC_SHA256"
    good = RequestValidator("sk-secret").compute_signature(url, params, "HMAC_SHA256")
    check_signature(keys, url, params, good, settings)
    check_signature(
        keys, url, params, RequestValidator(AUTH_TOKEN).compute_signature(url, params)
    )  # no header
    with pytest.raises(
        SignatureInvalid, match="does not match"
    ):  # the Auth Token's signature under the header
        check_signature(
            keys, url, params, RequestValidator(AUTH_TOKEN).compute_signature(url, params), settings
        )
    with pytest.raises(SignatureInvalid, match="does not hold"):
        check_signature(keys, url, params, good, "key=webhooks_sharedkey_2,algorithm=HMAC_SHA256")
    with pytest.raises(SignatureInvalid, match="does not hold"):  # no shared key configured
        check_signature(SigningKeys(auth_token=AUTH_TOKEN), url, params, good, settings)


def test_signatures_are_compared_in_constant_time(monkeypatch):
    """Timing cannot be measured reliably in a unit test: prove the comparison goes through
    `hmac.compare_digest` (and that nothing accepts a signature without it)."""
    seen = []

    def spy(a, b):
        seen.append((a, b))
        return False

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    url, params = "https://a.example.com/twilio/voice", {"CallSid": "CA1"}
    good = RequestValidator(AUTH_TOKEN).compute_signature(url, params)
    with pytest.raises(SignatureInvalid):
        check_signature(SigningKeys(auth_token=AUTH_TOKEN), url, params, good)
    assert seen and all(b == good.encode() for _, b in seen)


def test_twiml_and_settings():
    s = TwilioSettings(
        public_url="https://a.example.com/prefix/",
        credentials=TwilioCredentials(account_sid="AC", auth_token="t"),
    )
    assert s.voice_url == "https://a.example.com/prefix/twilio/voice"
    assert s.stream_url("tok") == "wss://a.example.com/prefix/twilio/stream/tok"
    with pytest.raises(ValueError):
        TwilioSettings(public_url="ftp://x", credentials=s.credentials)
    with pytest.raises(ValueError, match=r"wss:// \(error 31922\)"):  # Twilio refuses ws:// streams
        TwilioSettings(public_url="http://a.example.com", credentials=s.credentials)
    assert "<Dial>+15550001111</Dial>" in twiml.transfer("+15550001111")
    assert "auth_token=SecretStr('**********')" in repr(s.credentials)


def test_credentials_from_env_name_the_missing_variable():
    with pytest.raises(TwilioConfigError, match="TWILIO_AUTH_TOKEN"):
        TwilioCredentials.from_env({"TWILIO_ACCOUNT_SID": "AC1"})
    creds = TwilioCredentials.from_env({"TWILIO_ACCOUNT_SID": "AC1", "TWILIO_AUTH_TOKEN": "x"})
    assert creds.api_base_url is None


async def test_rest_hang_up_transfer_and_errors(caplog):
    caplog.set_level(logging.DEBUG)
    fake = FakeTwilioRest(missing_calls={"CA-gone"})
    async with fake.running() as url:
        creds = TwilioCredentials(account_sid=ACCOUNT_SID, auth_token=AUTH_TOKEN, api_base_url=url)
        async with TwilioRest(creds) as rest:
            assert await rest.hang_up("CA1") is True
            assert await rest.hang_up("CA-gone") is False  # already ended: not an error
            await rest.transfer("CA1", "+15550001111", caller_id="+15559998888")
        async with TwilioRest(creds.model_copy(update={"api_base_url": url + "/broken"})) as rest:
            with pytest.raises(TwilioRestError, match="HTTP 404"):
                await rest.place_call("+15551234567", "+15557654321", "https://a.example.com/twilio/voice")
    assert fake.requests[0]["form"] == {"Status": "completed"}
    assert fake.requests[2]["form"]["Twiml"].endswith(
        '<Response><Dial callerId="+15559998888">+15550001111</Dial></Response>'
    )
    assert AUTH_TOKEN not in caplog.text
