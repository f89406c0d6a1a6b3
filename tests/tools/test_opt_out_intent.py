"""The side-effect policy's keyword check (`duetaspan.router.intent`) on what people say to stop being called:
most of it is said as a negation of calling ("never call me again"), which the check read as a refusal of
"call" until the `opt_out` tool brought its own phrases (`duetaspan.tools.opt_out.PHRASES`); what only looks
like a request to stop, or takes it back, is still refused."""

from __future__ import annotations

import pytest

from duetaspan.router import explicit_request
from duetaspan.tools import opt_out


@pytest.mark.parametrize(
    "said",
    [
        "please never call me again",
        "don't call me again",
        "put me on your do-not-call list",
        "take me off your list",
        "stop calling me",
        "remove me from your list",
        "I want to opt out",
        "unsubscribe me please",
        "no more calls please",
        "do not call this number again",
    ],
)
def test_asking_not_to_be_called_again_is_a_request(said):
    assert explicit_request(opt_out.spec, {}, said, []) == (True, "explicit")


@pytest.mark.parametrize(
    "said",
    [
        "never mind, you can call me again",
        "I don't want to opt out",
        "how do I stop these calls",
        "why do you never call back",
        "call me again next week",
        "don't stop calling, I like it",
    ],
)
def test_what_only_looks_like_it_is_refused(said):
    asked, _ = explicit_request(opt_out.spec, {}, said, [])
    assert asked is False
