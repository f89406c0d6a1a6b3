"""docs/webhooks.md stays true: its JSON Schema is the generated one, the documented example body validates
against it, and its Python and Node verification snippets accept a real signed delivery and refuse a forged
or old one (the Node snippet run by the real `node`, where installed)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import jsonschema
import pytest

from duetaspan.webhooks import SignatureError, signature_header
from duetaspan.webhooks.events import body_schema
from tests.support import REPO_ROOT

DOC = (REPO_ROOT / "docs" / "webhooks.md").read_text(encoding="utf-8")


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC, re.S | re.M)


def test_the_documented_schema_is_the_generated_one_and_the_example_fits():
    schema, example = (json.loads(b) for b in _blocks("json")[::-1][:2])
    assert schema == body_schema()
    jsonschema.validate(example, schema)
    bad = {**example, "data": {**example["data"], "recorded": "yes"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


BODY = b'{"id":"evt_1","type":"call.ended","created":1,"call_id":"CA1","data":{"outcome":"completed"}}'


def test_the_python_snippet_verifies():
    [snippet] = _blocks("python")
    seen: list[str] = []
    scope = {"SECRET": "s3", "already_seen": lambda i: i in seen, "process": lambda *a: seen.append(a[1])}
    exec(compile(snippet, "webhooks.md", "exec"), scope)
    good = signature_header(BODY, ["s3"])
    assert scope["handle"](BODY, {"Duetaspan-Signature": good}) == 200 and seen == ["CA1"]
    assert scope["handle"](BODY, {"Duetaspan-Signature": signature_header(BODY, ["other"])}) == 400
    assert scope["handle"](BODY, {}) == 400
    assert SignatureError


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_node_snippet_verifies_real_signatures():
    [snippet] = _blocks("javascript")
    now = int(time.time())
    cases = {
        "good": signature_header(BODY, ["s3"], timestamp=now),
        "rotated": signature_header(BODY, ["new", "s3"], timestamp=now),
        "forged": signature_header(BODY, ["other"], timestamp=now),
        "old": signature_header(BODY, ["s3"], timestamp=now - 600),
    }
    script = snippet + (
        "\nconst cases = " + json.dumps(cases) + ";\nconst body = " + json.dumps(BODY.decode()) + ";\n"
        "for (const [name, header] of Object.entries(cases)) {\n"
        "  try { console.log(name, verify(Buffer.from(body), header, 's3').call_id); }\n"
        "  catch (e) { console.log(name, 'refused'); }\n}\n"
    )
    out = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:4] == ["good CA1", "rotated CA1", "forged refused", "old refused"]
