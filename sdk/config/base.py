"""What every `agent.toml` section shares: unknown keys are errors, and pydantic errors read as one line that
names the field (`mcp_servers[0].command: field required`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class _Section(BaseModel):
    # Typos in a config file should fail loudly, not be ignored.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def format_errors(exc: ValidationError) -> str:
    """`mcp_servers[0].command: field required; router.mode: ...` from a pydantic error."""
    parts = []
    for err in exc.errors():
        loc = ""
        for item in err["loc"]:
            loc += f"[{item}]" if isinstance(item, int) else (f".{item}" if loc else str(item))
        msg = err["msg"]
        msg = msg.removeprefix("Value error, ")
        msg = msg[:1].lower() + msg[1:]
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)


__all__ = ["format_errors"]
