"""After the call: signed lifecycle webhooks delivered from the store's outbox, end-of-call analysis, and
callers' privacy (redaction, consent, retention). See docs/webhooks.md, docs/analysis.md, docs/privacy.md.

For receivers, `duetaspan.webhooks.verify(body, header, secret, tolerance_s=300)` checks a delivery's
`Duetaspan-Signature` and returns its JSON body:

    >>> from duetaspan.webhooks import signature_header, verify
    >>> body = b'{"id":"evt_1","type":"call.started","created":1700000000,"call_id":"CA1","data":{}}'
    >>> verify(body, signature_header(body, ["k"], timestamp=1700000000), "k", now=1700000001)["id"]
    'evt_1'
"""

from __future__ import annotations

from duetaspan.webhooks.redact import KINDS, Redactor
from duetaspan.webhooks.signing import HEADER, SignatureError, signature_header, verify

__all__ = ["HEADER", "KINDS", "Redactor", "SignatureError", "signature_header", "verify"]
