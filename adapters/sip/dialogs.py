"""Dialog state aiosipua gets wrong or leaves out (RFC 3261 section 12), as small functions on its objects:
the route set in the right order (the UAS keeps the INVITE's Record-Route in order; the UAC reverses the
2xx's), the remote target from the 2xx's Contact on calls we place, and where an in-dialog request goes
(`next_hop`: the first route of a loose-routing route set, else the remote target's address).

A remote target with a private address reached from a public source is a phone behind NAT that did not fix
its Contact: the request goes to the source address instead (what RFC 7362's symmetric signalling does).
Over TCP/TLS the request goes down the connection the dialog came on (our listener does not dial out).
A host name (not an address literal) in a route or Contact also falls back to the source address: the hop is
chosen without a DNS lookup on the call's path.

Example:
    >>> hop_of("<sip:10.0.0.5:5070;lr>")
    ('10.0.0.5', 5070)
"""

from __future__ import annotations

import ipaddress
from typing import Any

from aiosipua.headers import parse_uri, stringify_uri

from duetaspan.adapters.sip.transactions import split_header_values


def hop_of(value: str) -> tuple[str, int] | None:
    """The address literal and port of a `Route`/`Contact` value or URI; None for a host name."""
    text = value.strip()
    if "<" in text:
        text = text[text.index("<") + 1 : text.index(">")] if ">" in text else text[text.index("<") + 1 :]
    try:
        uri = parse_uri(text)
        ipaddress.ip_address(uri.host.strip("[]"))
    except Exception:  # a host name, or not a URI at all
        return None
    return uri.host.strip("[]"), int(uri.port or 5060)


def uas_route_set(request: Any) -> list[str]:
    """The route set of a dialog we answer: the INVITE's Record-Route values in their order (12.1.1)."""
    return split_header_values(request.headers.get("record-route"))


def next_hop(dialog: Any, source: tuple[str, int], *, reliable: bool) -> tuple[str, int]:
    """Where an in-dialog request of `dialog` goes (see the module docstring)."""
    if reliable:
        return source
    if dialog.route_set:
        return hop_of(dialog.route_set[0]) or source
    target = hop_of(dialog.remote_target) if dialog.remote_target else None
    if target is None:
        return source
    try:
        natted = ipaddress.ip_address(target[0]).is_private and not ipaddress.ip_address(source[0]).is_private
    except ValueError:
        natted = False
    return source if natted else target


def confirm_from_2xx(call: Any, response: Any, *, reliable: bool) -> None:
    """A call we placed was answered: its remote target is the 2xx's Contact and its route set the 2xx's
    Record-Route reversed (12.1.2); the ACK and later requests go to their next hop."""
    contacts = response.contact
    if contacts:
        call.dialog.remote_target = stringify_uri(contacts[0].uri)
    call.dialog.route_set = list(reversed(split_header_values(response.headers.get("record-route"))))
    call.remote_addr = next_hop(call.dialog, call.remote_addr, reliable=reliable)


__all__ = ["confirm_from_2xx", "hop_of", "next_hop", "uas_route_set"]
