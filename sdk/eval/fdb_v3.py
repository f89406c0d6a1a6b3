"""Full-Duplex-Bench v3 (`--format fdb-v3`): its published `benchmark_data_v2.json` as a `Suite`, and the
benchmark's 12 mock tools, written from their documented behaviour (the data file is not redistributed: the
user downloads it from the benchmark's repository).

Each FDB-v3 dialogue has a context turn and a request turn: the request is routed, the context turn and the
scripted agent reply before it are conversation context. `state_rollback_test` marks self-correction.

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

from pathlib import Path
from typing import Any

from duetaspan.errors import ConfigError
from duetaspan.eval.scenario import ExpectedCall, MockTool, Scenario, Suite, Turn, read_data


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


def _scenario(item: dict[str, Any], audio_dir: Path | None) -> Scenario:
    dialogue = item.get("dialogue") or []
    if not dialogue:
        raise ConfigError(f"FDB-v3 scenario {item.get('id')!r}: empty dialogue")
    turns = [
        Turn(
            text=d.get("user", ""),
            route=i == len(dialogue) - 1,
            agent=d.get("ai") if i < len(dialogue) - 1 else None,
        )
        for i, d in enumerate(dialogue)
    ]
    audio = None
    if audio_dir is not None:  # the released audio: <audio_dir>/<id>_<speaker>/input.wav
        found = sorted(audio_dir.glob(f"{item['id']}_*/input.wav"))
        audio = found[0] if found else None
    return Scenario(
        id=str(item["id"]),
        turns=turns,
        audio=audio,
        expected_calls=[ExpectedCall.model_validate(c) for c in item.get("expected_tool_calls", [])],
        self_correction=bool(item.get("state_rollback_test", False)),
        tags=[str(f) for f in item.get("disfluency_features", [])],
        meta={
            k: item[k]
            for k in ("domain", "difficulty", "title", "latency_profile", "state_rollback_details")
            if k in item
        }
        | {"reference_answer": dialogue[-1].get("ai", "")},
    )


def fdb_v3_suite(data: dict[str, Any], *, audio_dir: Path | None = None) -> Suite:
    """A `Suite` from the parsed `benchmark_data_v2.json`."""
    items = data.get("scenarios") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ConfigError("FDB-v3 data: expected a top-level `scenarios` list (benchmark_data_v2.json)")
    try:
        scenarios = [_scenario(item, audio_dir) for item in items]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"FDB-v3 data: malformed scenario ({exc})") from None
    return Suite(
        name=str(data.get("benchmark_name", "Full-Duplex-Bench v3")),
        format="fdb-v3",
        tools=fdb_v3_tools(),
        scenarios=scenarios,
    )


def load_fdb_v3(path: str | Path, *, audio_dir: Path | None = None) -> Suite:
    """Load `benchmark_data_v2.json` (as published) into a `Suite`."""
    path = Path(path)
    suite = fdb_v3_suite(read_data(path), audio_dir=audio_dir)
    suite.base_dir = path.parent.resolve()
    return suite
