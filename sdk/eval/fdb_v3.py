"""Full-Duplex-Bench v3 (`--format fdb-v3`): its published `benchmark_data_v2.json` as a `Suite`, and the
benchmark's 12 mock tools, written from their documented behaviour (the data file is not redistributed: the
user downloads it from the benchmark's repository).

Each FDB-v3 dialogue has a context turn and a request turn: the request is routed, the context turn and the
scripted agent reply before it are conversation context. `state_rollback_test` marks self-correction.

The loader accepts the file as the publisher ships it: it validates what it uses (ids, dialogue lines,
expected calls' `function` and `args`, `state_rollback_test`, `disfluency_features`) with an error naming the
scenario, keeps everything else in the scenario's `meta` (and the header, with its statistics, in the
suite's), and warns, one line per kind, about what it cannot honour: conditional calls (`note`), arguments
the tool schemas do not declare or type differently, `$RESULT_n...` references (accepted as any value, as
the benchmark's scorers do). With `audio_dir`, each released recording is a sample of its own.

Example:
    >>> suite = fdb_v3_suite({"scenarios": [{"id": "travel_01", "dialogue": [
    ...     {"user": "Hi, I need a flight.", "ai": "Sure, where to?"},
    ...     {"user": "Um, Paris on July 15th.", "ai": "Searching flights to Paris."}],
    ...     "expected_tool_calls": [{"function": "search_flights",
    ...                              "args": {"destination": "Paris", "date": "July 15"}}]}]})
    >>> [t.route for t in suite.scenarios[0].turns], [t.name for t in suite.tools][:2]
    ([False, True], ['search_flights', 'book_flight'])
"""

from __future__ import annotations

import glob
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from duetaspan.errors import ConfigError
from duetaspan.eval.scenario import ExpectedCall, MockTool, Scenario, Suite, Turn, read_data

log = logging.getLogger(__name__)


def _schema(required: dict[str, str], optional: dict[str, str] | None = None) -> dict[str, Any]:
    properties = {k: {"type": v} for k, v in {**required, **(optional or {})}.items()}
    return {"type": "object", "properties": properties, "required": list(required)}


# name -> (description, schema, side effect). Signatures are the benchmark agent's; the descriptions are ours.
TOOL_SPECS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "search_flights": (
        "Search available flights to a destination on a date. Always use it for flight questions.",
        _schema({"destination": "string", "date": "string"}),
        False,
    ),
    "book_flight": (
        "Book the flight found by search_flights for a passenger.",
        _schema({"passenger_name": "string"}),
        True,
    ),
    "update_identity_doc": (
        "Update an identity document on the caller's profile (passport, driver license, ...).",
        _schema({"doc_type": "string", "doc_number": "string"}),
        True,
    ),
    "get_card_benefits": (
        "The benefits of a credit card type.",
        _schema({"card_type": "string"}),
        False,
    ),
    "get_exchange_rate": (
        "Convert an amount between two currencies at today's rate.",
        _schema({"amount": "number", "from_currency": "string", "to_currency": "string"}),
        False,
    ),
    "modify_autopay": (
        "Turn on automatic payment of a bill from a source account.",
        _schema({"bill_type": "string", "source_account": "string"}),
        True,
    ),
    "search_apartments": (
        "Search apartments for rent in a city by number of bedrooms and maximum price.",
        _schema({"city": "string", "bedrooms": "integer", "max_price": "number"}),
        False,
    ),
    "calculate_commute": (
        "Commute time between two addresses.",
        _schema({"origin_address": "string", "destination_address": "string"}, {"mode": "string"}),
        False,
    ),
    "update_search_filter": (
        "Change one filter of the current search (e.g. max_price, bedrooms, pets).",
        _schema({"filter_name": "string", "value": "string"}),
        True,
    ),
    "track_order": (
        "The shipping status of an order.",
        _schema({"order_id": "string"}),
        False,
    ),
    "search_products": (
        "Search the store's products, optionally under a maximum price.",
        _schema({"query": "string"}, {"max_price": "number"}),
        False,
    ),
    "add_to_cart": (
        "Add a product (by product_id from search_products) to the cart.",
        _schema({"product_id": "string"}, {"quantity": "integer"}),
        True,
    ),
}


def mock_result(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """What the benchmark's mock API returns for a call (every result has `"status": "success"`).

    Example:
        >>> mock_result("get_exchange_rate", {"amount": 100, "from_currency": "EUR", "to_currency": "USD"})
        {'status': 'success', 'converted_amount': 110.0, 'rate': 1.1}
    """
    a = args
    if name == "search_flights":
        flight = {
            "flight_id": "FL123",
            "destination": a.get("destination"),
            "date": a.get("date"),
            "price": 450.0,
        }
        out: dict[str, Any] = {"flights": [flight]}
    elif name == "book_flight":
        out = {"booking_ref": "B789", "passenger": a.get("passenger_name")}
    elif name == "update_identity_doc":
        out = {"updated_doc": a.get("doc_type"), "masked_number": str(a.get("doc_number", ""))[-4:]}
    elif name == "get_card_benefits":
        out = {"benefits": ["2% Cashback", "No Foreign Transaction Fee"]}
    elif name == "get_exchange_rate":
        rate = 1.1 if str(a.get("from_currency", "")).upper() == "EUR" else 0.9
        out = {"converted_amount": round(float(a.get("amount", 0)) * rate, 2), "rate": rate}
    elif name == "modify_autopay":
        out = {"autopay_enabled": True, "bill": a.get("bill_type"), "source": a.get("source_account")}
    elif name == "search_apartments":
        price = float(a.get("max_price", 2000) or 2000) - 100
        out = {"results": [{"id": "APT1", "price": price, "beds": a.get("bedrooms", 1)}]}
    elif name == "calculate_commute":
        out = {"duration_mins": 25, "mode": a.get("mode", "driving")}
    elif name == "update_search_filter":
        out = {"filter_updated": a.get("filter_name"), "new_value": a.get("value")}
    elif name == "track_order":
        out = {"shipping_status": "Out for delivery"}
    elif name == "search_products":
        price = a.get("max_price") or 99.99
        out = {"products": [{"product_id": "PROD1", "name": f"{a.get('query', '')} Premium", "price": price}]}
    elif name == "add_to_cart":
        quantity = int(a.get("quantity", 1) or 1)
        out = {"quantity": quantity, "cart_total": round(99.99 * quantity, 2)}
    else:
        raise KeyError(f"no FDB-v3 mock tool named {name!r}")
    return {"status": "success", **out}


def fdb_v3_tools() -> list[MockTool]:
    """The 12 benchmark tools as mock tools (their results come from `mock_result`)."""
    return [
        MockTool(name=name, description=desc, parameters=schema, side_effect=side_effect, result=None)
        for name, (desc, schema, side_effect) in TOOL_SPECS.items()
    ]


# --- the published scenario file ------------------------------------------------------------------------------
# What the loader uses (validated, with a clear error naming the scenario); everything else a scenario carries
# (domain, title, difficulty, acting_notes, latency_profile, state_rollback_details, num_expected_calls, ...) is
# kept in its `meta`, and the file's header (benchmark_name, version, generated_at, statistics) in the suite's.
_USED = {"id", "dialogue", "expected_tool_calls", "state_rollback_test", "disfluency_features"}
_CALL_KEYS = {"function", "args", "note"}
_REFERENCE = re.compile(r"^\$RESULT_(\d+)(?![\w])")
_FITS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
}


@dataclass
class _Findings:
    """What the file asks that we cannot honour (or honour only as the benchmark's scorers do): one warning
    line per kind, naming a few examples."""

    notes: list[str] = field(default_factory=list)
    unknown_tools: list[str] = field(default_factory=list)
    undeclared: list[str] = field(default_factory=list)
    unrequired: list[str] = field(default_factory=list)
    mistyped: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    odd_references: list[str] = field(default_factory=list)
    call_fields: list[str] = field(default_factory=list)
    miscounted: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        kinds = [
            (self.notes, "expected calls carry a condition `note`", "conditions are not evaluated: these calls "
             "are expected unconditionally, as the benchmark's scorers expect them"),
            (self.unknown_tools, "expected calls name a tool the benchmark does not have", "they can never be "
             "called, so these scenarios cannot pass"),
            (self.undeclared, "expected arguments are not in the tool's schema", "the benchmark's tool "
             "signatures do not have them and, like its agent, the mock tools drop them, so these scenarios "
             "cannot pass"),
            (self.unrequired, "expected calls leave out arguments the tool's schema requires", "a router that "
             "follows the schema adds them (the scorers ignore extra arguments); a call made exactly as "
             "expected fails the schema, and its reply is repaired or dropped"),
            (self.mistyped, "expected argument values have a type the tool's schema does not declare", "the "
             "exact rule compares without type coercion, so a call that follows the schema cannot match them "
             "(an LLM judge, --judge-base-url, may)"),
            (self.references, "expected arguments refer to earlier tool results ($RESULT_n...)", "any value is "
             "accepted for them (the key must be present), as the benchmark's scorers do; that the value came "
             "from that result is not checked"),
            (self.odd_references, "expected arguments start with `$` but are not $RESULT_n references to an "
             "earlier call", "any value is accepted for them, as the benchmark's scorers do"),
            (self.call_fields, "expected calls carry fields we do not use", "kept in the scenario's meta"),
            (self.miscounted, "scenarios' `num_expected_calls` differs from the calls they list", "the listed "
             "calls are scored"),
        ]  # fmt: skip
        return [f"FDB-v3 data: {len(items)} {what} ({_examples(items)}); {then}" for items, what, then in kinds
                if items]  # fmt: skip


def _examples(items: list[str], k: int = 4) -> str:
    return "; ".join(items[:k]) + (f"; and {len(items) - k} more" if len(items) > k else "")


def _text(value: Any, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where} must be text, got {type(value).__name__}")


def _expected(where: str, sid: str, index: int, call: Any, found: _Findings) -> ExpectedCall:
    at = f"{where}: expected_tool_calls[{index}]"
    if not isinstance(call, dict):
        raise ConfigError(f"{at} must be an object with `function` and `args`, got {type(call).__name__}")
    name = call.get("function")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{at} has no `function` name")
    args = call.get("args") if call.get("args") is not None else {}
    if not isinstance(args, dict):
        raise ConfigError(f"{at}: `args` must be an object, got {type(args).__name__}")
    note = call.get("note")
    if note is not None:
        found.notes.append(f"{sid} {name}: {note!r}")
    if extra := sorted(set(call) - _CALL_KEYS):
        found.call_fields.append(f"{sid} {name}: {', '.join(extra)}")
    spec = TOOL_SPECS.get(name)
    if spec is None:
        found.unknown_tools.append(f"{sid}: {name}")
    properties: dict[str, Any] = spec[1]["properties"] if spec else {}
    if spec is not None and (missing := [key for key in spec[1]["required"] if key not in args]):
        found.unrequired.append(f"{sid}: {name} without {', '.join(missing)}")
    for key, value in args.items():
        label = f"{sid}: {name}.{key}"
        if spec is not None and key not in properties:
            found.undeclared.append(label)
        elif isinstance(value, str) and value.startswith("$"):
            match = _REFERENCE.match(value)
            if match and int(match[1]) < index:
                found.references.append(label)
            else:
                found.odd_references.append(f"{label}={json.dumps(value)}")
        elif key in properties and not _FITS.get(properties[key]["type"], lambda v: True)(value):
            found.mistyped.append(f"{label}={json.dumps(value)} (schema: {properties[key]['type']})")
    return ExpectedCall(tool=name, args=args, note=None if note is None else str(note))


def _scenario(item: Any, index: int, found: _Findings) -> Scenario:
    if not isinstance(item, dict):
        raise ConfigError(f"FDB-v3 data: scenarios[{index}] is not an object")
    raw_id = item.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or not str(raw_id).strip():
        raise ConfigError(f"FDB-v3 data: scenarios[{index}] has no `id`")
    sid = str(raw_id)
    where = f"FDB-v3 scenario {sid!r}"
    dialogue = item.get("dialogue")
    if not isinstance(dialogue, list) or not dialogue:
        raise ConfigError(f"{where}: `dialogue` must be a non-empty list of turns")
    turns: list[Turn] = []
    for i, turn in enumerate(dialogue):
        if not isinstance(turn, dict) or "user" not in turn:
            raise ConfigError(f"{where}: dialogue[{i}] must be an object with a `user` line")
        last = i == len(dialogue) - 1
        agent = None if last else _text(turn.get("ai"), f"{where}: dialogue[{i}].ai") or None
        turns.append(Turn(text=_text(turn["user"], f"{where}: dialogue[{i}].user"), route=last, agent=agent))
    if not turns[-1].text.strip():
        raise ConfigError(f"{where}: the request (the last dialogue turn) has no words")
    calls = item.get("expected_tool_calls") if item.get("expected_tool_calls") is not None else []
    if not isinstance(calls, list):
        raise ConfigError(f"{where}: `expected_tool_calls` must be a list")
    expected = [_expected(where, sid, i, call, found) for i, call in enumerate(calls)]
    rollback = item.get("state_rollback_test", False)
    if not isinstance(rollback, bool):
        raise ConfigError(f"{where}: `state_rollback_test` must be true or false, got {rollback!r}")
    features = item.get("disfluency_features") or []
    features = [features] if isinstance(features, str) else features
    if not isinstance(features, list):
        raise ConfigError(f"{where}: `disfluency_features` must be a list")
    count = item.get("num_expected_calls")
    if count is not None and count != len(expected):
        found.miscounted.append(f"{sid}: {count!r} for {len(expected)}")
    meta = {k: v for k, v in item.items() if k not in _USED}
    meta |= {"example_id": sid, "reference_answer": _text(dialogue[-1].get("ai"), f"{where}: ai")}
    if any("user_annotated" in t for t in dialogue):
        meta["user_annotated"] = [t.get("user_annotated") for t in dialogue]
    if any(set(c) - _CALL_KEYS for c in calls):
        meta["expected_call_fields"] = [{k: v for k, v in c.items() if k not in _CALL_KEYS} for c in calls]
    return Scenario(
        id=sid,
        turns=turns,
        expected_calls=expected,
        self_correction=rollback,
        tags=[str(f) for f in features],
        meta=meta,
    )


def _recordings(suite: list[Scenario], audio_dir: Path) -> tuple[list[Scenario], list[str]]:
    """One sample per released recording (`<audio_dir>/<id>_<speaker>/input.wav`, the id `<id>_<speaker>`);
    scenarios without one stay as they are (audio mode then needs --tts-command for them)."""
    out: list[Scenario] = []
    missing: list[str] = []
    for s in suite:
        found = sorted(audio_dir.glob(f"{glob.escape(s.id)}_*/input.wav"))
        if not found:
            missing.append(s.id)
            out.append(s)
        for wav in found:
            meta = {**s.meta, "recording": wav.parent.name}
            out.append(s.model_copy(update={"id": wav.parent.name, "audio": wav, "meta": meta}))
    return out, missing


def fdb_v3_suite(data: Any, *, audio_dir: Path | None = None) -> Suite:
    """A `Suite` from the parsed `benchmark_data_v2.json`, as published (see the section comment above);
    what we cannot honour is in `suite.warnings` (one line per kind) and logged."""
    items = data.get("scenarios") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ConfigError("FDB-v3 data: expected a top-level `scenarios` list (benchmark_data_v2.json)")
    found = _Findings()
    scenarios = [_scenario(item, i, found) for i, item in enumerate(items)]
    warnings = found.lines()
    stats = data.get("statistics")
    total = stats.get("total_scenarios") if isinstance(stats, dict) else None
    if isinstance(total, int) and not isinstance(total, bool) and total != len(items):
        warnings.append(f"FDB-v3 data: the header's statistics count {total} scenarios, the file has "
                        f"{len(items)}; the file's scenarios are run")  # fmt: skip
    if audio_dir is not None:
        scenarios, missing = _recordings(scenarios, audio_dir)
        if missing:
            warnings.append(f"FDB-v3 audio: {len(missing)} of {len(items)} scenarios have no recording in "
                            f"{audio_dir} ({_examples(missing)}); audio mode renders them with --tts-command "
                            "or leaves them out")  # fmt: skip
    try:
        suite = Suite(
            name=str(data.get("benchmark_name") or "Full-Duplex-Bench v3"),
            format="fdb-v3",
            tools=fdb_v3_tools(),
            scenarios=scenarios,
            meta={k: v for k, v in data.items() if k != "scenarios"},
            warnings=warnings,
        )
    except ValidationError as exc:
        raise ConfigError(f"FDB-v3 data: {exc.errors(include_url=False)[0]['msg']}") from None
    for line in warnings:
        log.warning("%s", line)
    return suite


def load_fdb_v3(path: str | Path, *, audio_dir: Path | None = None) -> Suite:
    """Load `benchmark_data_v2.json` (as published) into a `Suite`."""
    path = Path(path)
    suite = fdb_v3_suite(read_data(path), audio_dir=audio_dir)
    suite.base_dir = path.parent.resolve()
    return suite
