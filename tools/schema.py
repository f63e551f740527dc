"""Turn pydantic argument models into clean OpenAI tool schemas, read the
arguments a model sends within limits, and explain validation failures in
words a model can act on.

The schema goes into the prompt on every request, so it is kept small and
stable: no pydantic `title` noise, optional fields rendered as their plain
type instead of `anyOf [..., null]`, keys in a fixed order.

Arguments are the model's text (or a remote server's): `json.loads` follows
nesting by recursion, so `{"path": [[[[...]]]]}` 100,000 deep raised
RecursionError out of the agent loop and ended the task. `load_arguments`
refuses text over MAX_ARGUMENT_CHARS, nesting deeper than MAX_ARGUMENT_DEPTH
and numbers JSON cannot hold (NaN, Infinity, 1e400) with ArgumentShapeError,
a ValueError, which the registry turns into a tool error the model reads.
(The engine bounds what it parses the same way, in engine.chat.json_limits;
`tools` imports nothing from the engine.)
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ValidationError

# No tool's arguments nest anywhere near this deep; the bound keeps every reader
# after the parse (validation, hooks, printers) far from Python's recursion limit.
MAX_ARGUMENT_DEPTH = 64
# More text than any model's context holds (256k tokens is about 1 MiB of text).
MAX_ARGUMENT_CHARS = 4 * 1024 * 1024


class ArgumentShapeError(ValueError):
    """Arguments that are too long, nest too deeply or hold a number that is not finite."""


def _reject_constant(name: str) -> Any:
    raise ArgumentShapeError(f"{name} is not JSON; numbers must be finite")


def check_argument_shape(value: Any) -> None:
    """Raise ArgumentShapeError when parsed arguments nest deeper than MAX_ARGUMENT_DEPTH
    or hold a float that is not finite. Iterative, so any depth is safe to look at."""
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        node, depth = stack.pop()
        if depth > MAX_ARGUMENT_DEPTH:
            raise ArgumentShapeError(f"they nest deeper than {MAX_ARGUMENT_DEPTH} levels")
        for item in node.values() if isinstance(node, dict) else node:
            if isinstance(item, dict | list):
                stack.append((item, depth + 1))
            elif isinstance(item, float) and not math.isfinite(item):
                raise ArgumentShapeError(f"{item} is not a finite number")


def load_arguments(text: str) -> Any:
    """A tool call's argument text as JSON, within the limits above.

    Raises ValueError: json.JSONDecodeError (or the digit limit's ValueError)
    for text that is not JSON Python can read, ArgumentShapeError for the rest."""
    if len(text) > MAX_ARGUMENT_CHARS:
        raise ArgumentShapeError(
            f"they are {len(text):,} characters, more than the {MAX_ARGUMENT_CHARS:,} "
            "a tool call may carry"
        )
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ArgumentShapeError(f"they nest deeper than {MAX_ARGUMENT_DEPTH} levels") from None
    check_argument_shape(value)
    return value


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
