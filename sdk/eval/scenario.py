"""Scenario files for `duetaspan eval`: pydantic models and the YAML/JSON loader (our own format; see
docs/evals.md). Full-Duplex-Bench v3 files are converted into the same models by `duetaspan.eval.fdb_v3`.

A suite holds scenarios and, optionally, mock tools with canned results (when it declares tools, they are the
agent's only tools during the run; otherwise the agent's own tools are used).

Example:
    >>> suite = Suite.model_validate({
    ...     "tools": [{"name": "get_weather", "parameters": {"city": "string"},
    ...                "result": {"forecast": "sunny, 24 C"}}],
    ...     "scenarios": [{"id": "weather", "turns": ["What's the weather in Sydney?"],
    ...                    "expected_calls": [{"tool": "get_weather", "args": {"city": "Sydney"}}],
    ...                    "expect_words": ["sunny"]}]})
    >>> suite.scenarios[0].turns[0].text, suite.scenarios[0].expected_calls[0].tool
    ("What's the weather in Sydney?", 'get_weather')
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from duetaspan.errors import ConfigError

_TYPES = {"string", "integer", "number", "boolean", "array", "object"}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class Turn(_Model):
    """One caller turn: its words (`text`), optionally its recording (`audio`, a wav path relative to the
    scenario file); `route: false` makes it context only (text mode); `agent` is what the agent answered
    (context for the router in text mode: no duplex model speaks there)."""

    text: str = ""
    audio: Path | None = None
    route: bool = True
    agent: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"text": value} if isinstance(value, str) else value


class ExpectedCall(_Model):
    """A tool call the agent should make: the tool's name and the arguments to check (extra keys the agent
    passes are not penalised; a value starting with `$` accepts any value, as in FDB-v3)."""

    tool: str = Field(validation_alias=AliasChoices("tool", "function", "name"))
    args: dict[str, Any] = Field(default_factory=dict, validation_alias=AliasChoices("args", "arguments"))
    note: str | None = None  # free text, e.g. FDB-v3's conditions ("Only if flight < $300"): not scored


class MockTool(_Model):
    """A mock tool declared in the scenario file: its schema and a canned `result` (or an `error`).

    `parameters` is a JSON schema object, or the short form `{"city": "string", "days": "integer?"}` (a
    trailing `?` makes the argument optional).
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=dict)
    result: Any = None
    error: str | None = None
    side_effect: bool = False

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        if not value:
            return {"type": "object", "properties": {}}
        if value.get("type") == "object" or isinstance(value.get("properties"), dict):
            return {"type": "object", **value}
        properties: dict[str, Any] = {}
        required: list[str] = []
        for key, kind in value.items():
            if not isinstance(kind, str) or kind.rstrip("?") not in _TYPES:
                raise ValueError(
                    f"parameter {key!r}: short-form types are {sorted(_TYPES)} (add '?' for optional), "
                    f"got {kind!r}; or give a full JSON schema with type: object"
                )
            properties[key] = {"type": kind.rstrip("?")}
            if not kind.endswith("?"):
                required.append(key)
        return {"type": "object", "properties": properties, "required": required}


class Scenario(_Model):
    """One test conversation and what a correct agent does in it.

    Attributes:
        id: unique in the suite.
        turns: the caller's turns, in order.
        audio: one recording of the whole caller side (audio mode), instead of per-turn audio.
        expected_calls: the tool calls a correct agent makes, in any order (none: it must call no tool).
        expect_words / forbid_words: words the agent's answer must / must not contain (case-insensitive).
        self_correction: the caller corrects themselves; the agent must use the corrected value.
        tags: free labels; `split` groups come from the number of expected calls and `self_correction`.
    """

    id: str
    turns: list[Turn]
    audio: Path | None = None
    expected_calls: list[ExpectedCall] = Field(
        default_factory=list, validation_alias=AliasChoices("expected_calls", "expect_calls")
    )
    expect_words: list[str] = Field(default_factory=list)
    forbid_words: list[str] = Field(default_factory=list)
    self_correction: bool = False
    tags: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("turns")
    @classmethod
    def _some_turns(cls, value: list[Turn]) -> list[Turn]:
        if not value:
            raise ValueError("a scenario needs at least one caller turn")
        return value

    @property
    def splits(self) -> list[str]:
        """The report groups this scenario counts in: no-call / single-call / multi-call, self-correction."""
        n = len(self.expected_calls)
        out = ["no-call" if n == 0 else "single-call" if n == 1 else "multi-call"]
        if self.self_correction:
            out.append("self-correction")
        return out


class Suite(_Model):
    """A scenario file: scenarios plus optional mock tools. `format` says how answers are scored:
    `duetaspan` (tool calls, arguments and answer words) or `fdb-v3` (tool calls and arguments only)."""

    name: str = ""
    format: str = "duetaspan"
    tools: list[MockTool] = Field(default_factory=list)
    scenarios: list[Scenario]
    meta: dict[str, Any] = Field(default_factory=dict)  # free; FDB-v3: the file's header (statistics...)
    base_dir: Path = Field(default_factory=Path.cwd, exclude=True)
    warnings: list[str] = Field(default_factory=list, exclude=True)  # what the loader could not honour

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        seen: set[str] = set()
        for s in self.scenarios:
            if s.id in seen:
                raise ValueError(f"scenario id {s.id!r} is used twice")
            seen.add(s.id)
        return self

    def resolve(self, path: Path | None) -> Path | None:
        """A path from the file, relative to the file's folder."""
        if path is None:
            return None
        return path if path.is_absolute() else self.base_dir / path


def read_data(path: Path) -> Any:
    """A YAML or JSON file's data, with a clear error naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the scenario file ({exc.strerror or exc})") from None
    try:
        if path.suffix.lower() == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text)
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError: both say where
        raise ConfigError(f"{path}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {exc}") from None


def load_suite(path: str | Path) -> Suite:
    """Load one of our scenario files (`.yaml`, `.yml` or `.json`)."""
    path = Path(path)
    data = read_data(path)
    if isinstance(data, list):
        data = {"scenarios": data}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping with `scenarios:` (see docs/evals.md)")
    try:
        suite = Suite.model_validate({**data, "base_dir": path.parent.resolve()})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise ConfigError(f"{path}: {problems}") from None
    return suite
