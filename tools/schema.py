"""Turn pydantic argument models into clean OpenAI tool schemas, and explain
validation failures in words a model can act on.

The schema goes into the prompt on every request, so it is kept small and
stable: no pydantic `title` noise, optional fields rendered as their plain
type instead of `anyOf [..., null]`, keys in a fixed order.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

# Keys whose values are maps from *names* to schemas; the names themselves
# (a field may well be called "title") must never be treated as keywords.
_NAME_MAPS = ("properties", "$defs", "definitions", "patternProperties")


def clean_schema(node: Any) -> Any:
    """Recursively drop `title`, collapse nullable unions, drop `default: null`."""
    if isinstance(node, list):
        return [clean_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    cleaned: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title":
            continue
        if key in _NAME_MAPS and isinstance(value, dict):
            cleaned[key] = {name: clean_schema(sub) for name, sub in value.items()}
        else:
            cleaned[key] = clean_schema(value)
    branches = cleaned.get("anyOf")
    if isinstance(branches, list):
        non_null = [b for b in branches if b != {"type": "null"}]
        if len(non_null) == 1 and len(non_null) < len(branches):
            # `x: int | None = None` means "optional integer" to a model.
            del cleaned["anyOf"]
            cleaned = {**non_null[0], **cleaned}
    if "default" in cleaned and cleaned["default"] is None:
        del cleaned["default"]
    return cleaned


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The `parameters` object of an OpenAI function tool for `model`."""
    schema = clean_schema(model.model_json_schema())
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


def function_schema(name: str, description: str, model: type[BaseModel]) -> dict[str, Any]:
    """One entry of the OpenAI `tools` list."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": parameters_schema(model),
        },
    }


def expected_shape(model: type[BaseModel]) -> str:
    """A compact one-line description of the arguments a tool takes."""
    schema = parameters_schema(model)
    required = set(schema.get("required", []))
    parts = []
    for name, prop in schema["properties"].items():
        kind = prop.get("type") or ("enum" if "enum" in prop else "value")
        if kind == "array":
            kind = f"array of {prop.get('items', {}).get('type', 'value')}"
        if "enum" in prop:
            kind = " | ".join(json.dumps(v) for v in prop["enum"])
        suffix = "" if name in required else "?"
        parts.append(f'"{name}"{suffix}: {kind}')
    return "{" + ", ".join(parts) + "}"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, default=repr, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_validation_error(error: ValidationError) -> str:
    """One line per problem: where, what is wrong, and what was given."""
    lines = []
    for problem in error.errors(include_url=False):
        where = ".".join(str(part) for part in problem["loc"]) or "(arguments)"
        message = problem["msg"]
        if problem["type"] == "missing":
            lines.append(f"- {where}: required field is missing")
        elif problem["type"] == "extra_forbidden":
            lines.append(f"- {where}: unknown field (not part of this tool's arguments)")
        else:
            lines.append(f"- {where}: {message} (got {_short(problem.get('input'))})")
    return "\n".join(lines)
