"""PII redaction: each contract kind found (cards by Luhn, SSNs, phones via `phonenumbers`, e-mail, digits read
aloud), ordinary numbers kept, and the agent's per-frame tokens redacted across frames."""

from __future__ import annotations

import logging

import pytest

from duetaspan.webhooks.redact import KINDS, RedactingLogRecords, Redactor, luhn_ok

ALL = Redactor(KINDS)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("my card is 4111 1111 1111 1111", "my card is [card]"),
        ("it's 4111-1111-1111-1111 thanks", "it's [card] thanks"),
        ("amex 378282246310005", "amex [card]"),
        ("four one one one one one one one one one one one one one one one", "[card]"),
        ("my social is 123-45-6789", "my social is [ssn]"),
        ("one two three, four five, six seven eight nine", "[ssn]"),
        ("call me on (415) 555-2671 please", "call me on [phone] please"),
        ("my number is +44 20 7946 0958", "my number is [phone]"),
        ("mail ann.lee+x@clinic.co.uk now", "mail [email] now"),
        ("account five double five oh one two", "account [digits]"),
        ("member id 99887766", "member id [digits]"),
    ],
)
def test_each_kind_is_found(text, expected):
    assert ALL.redact(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "a table for 4 at 7:30 pm",
        "it costs $12.99, or 1,299 dollars for the year",
        "born in 1984, we're at 2210 Main Street suite 300",
        "one or two people, maybe three",
        "the flight UA 1234 at 10 am on the 21st",
        "4111 1111 1111 1112",  # fails Luhn and is a 16-digit run: digits only when "digits" is on
    ],
)
def test_ordinary_numbers_stay(text):
    r = Redactor(["card", "ssn", "phone", "email"]) if text.startswith("4111") else ALL
    assert r.redact(text) == text


def test_only_the_configured_kinds_and_luhn():
    assert Redactor(["email"]).redact("4111 1111 1111 1111 a@b.io") == "4111 1111 1111 1111 [email]"
    assert Redactor([]).redact("a@b.io") == "a@b.io" and not Redactor([])
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    with pytest.raises(ValueError, match="unknown kinds"):
        Redactor(["cards"])


def test_pieces_and_nested_values():
    pieces = [" my", " card", " is", " four"] + [" one"] * 15 + [" thanks"]
    out = ALL.redact_pieces(pieces)
    assert "".join(out) == " my card is [card] thanks" and len(out) == len(pieces)
    value = {"caller": "+14155552671", "text": "call 415 555 2671", "args": [{"n": "4111111111111111"}]}
    assert ALL.redact_value(value, keep=frozenset({"caller"})) == {
        "caller": "+14155552671",
        "text": "call [phone]",
        "args": [{"n": "[card]"}],
    }


def test_log_records_are_redacted_for_every_handler(caplog):
    hook = RedactingLogRecords(Redactor(["card"]))
    hook.install()
    try:
        with caplog.at_level(logging.INFO):
            logging.getLogger("duetaspan.test").info("caller said %s", "4111 1111 1111 1111")
    finally:
        hook.uninstall()
    with caplog.at_level(logging.INFO):
        logging.getLogger("duetaspan.test").info("after %s", "4111 1111 1111 1111")
    assert caplog.records[0].getMessage() == "caller said [card]"
    assert "4111 1111 1111 1111" in caplog.records[-1].getMessage()  # uninstalled: as it was


def test_a_logged_exception_s_traceback_and_stack_are_redacted():
    import io

    card = "4111 1111 1111 1111"
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("duetaspan.test.traceback")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    hook = RedactingLogRecords(Redactor(["card"]))
    hook.install()
    try:
        try:
            raise ValueError(f"charge declined for card {card}")
        except ValueError:
            log.exception("tool failed")
        stack = logging.getLogRecordFactory()("x", logging.INFO, __file__, 1, "m", None, None, sinfo=f"Stack: {card}")
    finally:
        hook.uninstall()
        log.removeHandler(handler)
        log.propagate = True
    text = out.getvalue()
    assert "Traceback (most recent call last)" in text and "ValueError: charge declined for card [card]" in text
    assert card not in text and "4111" not in text
    assert stack.stack_info == "Stack: [card]"


def test_the_benchmark_runs_and_meets_its_goal(tmp_path):
    import json
    import subprocess
    import sys

    from tests.support import REPO_ROOT

    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "redaction.py"), "--per-kind", "60",
                          "--seed", "11", "--json", str(out)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    figures = json.loads(out.read_text())
    assert all(k["recall"] >= 0.95 for k in figures["kinds"].values()), figures["kinds"]
    assert figures["ordinary"]["false_redactions"] == 0, figures["examples_false"]
    assert "recall" in run.stdout and "ordinary numbers" in run.stdout
