"""JSON schemas for Python tools: from the signature, type hints (pydantic) and the docstring.

Per-argument descriptions come from `Annotated[..., Field(description=...)]` or, failing that, from the
docstring's `Args:` section (Google, NumPy or reST style). Parameters annotated `CallContext` and one named
`idempotency_key` are left out (the registry passes them).
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from duetaspan.registry.context import CallContext
from duetaspan.registry.effects import IDEMPOTENCY_PARAM
from duetaspan.registry.errors import ToolDefinitionError

# Keys whose values are data, not sub-schemas: never strip "title" inside them.
_DATA_KEYS = frozenset({"default", "examples", "const", "enum"})


def describe(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The docstring's description (summary and body, without the Args section) and argument docs."""
    doc = inspect.getdoc(fn) or ""
    parsed = docstring_parser.parse(doc)
    parts = [p for p in (parsed.short_description, parsed.long_description) if p]
    params = {p.arg_name: " ".join(p.description.split()) for p in parsed.params if p.description}
    return "\n\n".join(parts).strip(), params


def _is_context(annotation: Any) -> bool:
    if annotation is CallContext:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_context(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return len(args) == 1 and args[0] is CallContext
    return False


def _has_description(annotation: Any) -> bool:
    if typing.get_origin(annotation) is not Annotated:
        return False
    return any(isinstance(m, FieldInfo) and m.description for m in typing.get_args(annotation)[1:])


def arguments_model(fn: Callable[..., Any], tool_name: str) -> tuple[type[BaseModel], list[str]]:
    """A pydantic model of `fn`'s tool arguments, and the names of its injected `CallContext` parameters."""
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:  # unresolved forward references are a definition error worth naming
        raise ToolDefinitionError(f"tool {tool_name!r}: cannot resolve type hints: {exc}") from exc
    _, arg_docs = describe(fn)
    fields: dict[str, Any] = {}
    context_params: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: *{param.name} / **{param.name} cannot be described by a JSON schema; "
                "declare each argument explicitly"
            )
        annotation = hints.get(param.name, Any)
        if param.name == IDEMPOTENCY_PARAM:  # injected by the registry (`duetaspan.registry.effects`)
            continue
        if _is_context(annotation):
            context_params.append(param.name)
            continue
        doc = arg_docs.get(param.name)
        if doc and not _has_description(annotation):
            annotation = Annotated[annotation, Field(description=doc)]
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(  # extra="ignore": LLMs add stray keys; dropping them beats failing the call
        f"{tool_name}_arguments", __config__=ConfigDict(extra="ignore"), **fields
    )
    return model, context_params


def clean_schema(schema: Any) -> Any:
    """Drop pydantic's auto-generated `title`s: they cost prompt tokens and tell the LLM nothing."""
    if isinstance(schema, dict):
        out = {}
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                continue
            out[key] = value if key in _DATA_KEYS else clean_schema(value)
        return out
    if isinstance(schema, list):
        return [clean_schema(v) for v in schema]
    return schema


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The tool's `parameters` schema: an object schema, always with `properties`."""
    schema = clean_schema(model.model_json_schema())
    schema.setdefault("properties", {})
    schema["type"] = "object"
    return schema
