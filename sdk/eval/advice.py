"""What `duetaspan eval` says when scenarios failed with errors: the first error and how to fix it (a router
without its API key, a router that cannot be reached), instead of a bare count.

Example:
    >>> from duetaspan.config import RouterConfig
    >>> report = {"n": 1, "errors": 1, "scenarios": [{"id": "s1", "error": "router LLM failed: HTTP 401"}]}
    >>> explain_errors(report, RouterConfig(api_key_env="NO_SUCH_KEY_VAR"), None)[0]
    'every scenario (1) failed with an error; the first, s1: router LLM failed: HTTP 401'
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

_AUTH = re.compile(r"\b(401|403)\b|api key|unauthori[sz]ed|authentication", re.IGNORECASE)
_UNREACHABLE = re.compile(
    r"cannot connect|connection refused|unreachable|name or service|getaddrinfo|no answer within", re.I
)
_OWN_SERVER = "--router-base-url http://127.0.0.1:8000/v1 --router-model NAME (any OpenAI-compatible server)"


def explain_errors(report: dict[str, Any], router: Any, report_path: Path | None) -> list[str]:
    """Lines for stderr: how many errored, the first error, a fix, and where the rest is."""
    errored = [row for row in report.get("scenarios", []) if row.get("error")]
    if not errored:
        return []
    first = errored[0]
    n, count = report.get("n", len(errored)), len(errored)
    head = f"every scenario ({n})" if count == n else f"{count} of {n} scenario(s)"
    lines = [f"{head} failed with an error; the first, {first['id']}: {first['error']}"]
    fix = _fix(str(first["error"]), router)
    if fix:
        lines.append(f"fix: {fix}")
    if report_path is not None:
        lines.append(f"every scenario's error: {report_path}")
    elif count > 1:
        lines.append("every scenario's error: add --report report.json")
    return lines


def _fix(error: str, router: Any) -> str | None:
    env: str = getattr(router, "api_key_env", None) or ""
    base_url = getattr(router, "base_url", "")
    unset = bool(env) and not os.environ.get(env)
    if _AUTH.search(error) or (unset and "openai.com" in base_url):
        if unset:
            return f"export {env}=<your key> (the router's [router] api_key_env), or use your own router: {_OWN_SERVER}"
        if not env:
            return f"the router at {base_url} wants a key: name its variable in [router] api_key_env"
        return f"the router at {base_url} refused the key in ${env}: check it, or use your own router: {_OWN_SERVER}"
    if _UNREACHABLE.search(error):
        return f"is the router at {base_url} up and reachable? Or use another: {_OWN_SERVER}"
    return None


__all__ = ["explain_errors"]
