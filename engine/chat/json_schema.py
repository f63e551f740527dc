"""Checking a JSON value against a JSON Schema, for the whole engine.

Two users: the tool parsers, which name a Kimi call whose header names no
tool by the one schema its arguments fit (`tool_parsers/schema_match.py`),
and the tests and bench/structured_output.py, for which it is an independent
oracle of what constrained decoding produced. (The `jsonschema` package is
not a dependency.) It covers the keywords `schema_support` lets through, with JSON
Schema's meaning: `type` (integer excludes booleans; 1.0 is an integer),
`properties`/`required`/`additionalProperties`, `items`/`prefixItems`,
`enum`/`const`, `anyOf`/`oneOf`/`allOf`, local `$ref`, string lengths in code
points, `pattern` (a search, as JSON Schema says), numeric bounds,
`multipleOf`, item and property counts, and a few common `format`s. Keywords
it does not know are annotations to it, as to any validator.
"""

from __future__ import annotations

import math
import re
from datetime import date, datetime, time
from typing import Any
from uuid import UUID

_FORMATS = {
    "date": lambda v: bool(date.fromisoformat(v)) and len(v) == 10,
    "date-time": lambda v: bool(datetime.fromisoformat(v.replace("Z", "+00:00"))),
    "time": lambda v: bool(time.fromisoformat(v.replace("Z", "+00:00"))),
    "uuid": lambda v: bool(UUID(v)) and len(v) == 36,
    "email": lambda v: re.fullmatch(r"[^@\s]+@[^@\s]+", v) is not None,
    "ipv4": lambda v: (
        re.fullmatch(
            r"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)", v
        )
        is not None
    ),
}


def json_type(value: Any) -> str:
    """The JSON Schema type of a parsed JSON value (2.0 is an integer, True is not)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON means it: true is not 1 (Python says it is), 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[key], b[key]) for key in a)
    return a == b


def _type_ok(value: Any, declared: Any) -> bool:
    if not isinstance(declared, str | list):
        return True  # not a type keyword any validator could read
    kinds = [declared] if isinstance(declared, str) else list(declared)
    actual = json_type(value)
    return actual in kinds or (actual == "integer" and "number" in kinds)


def _resolve(root: dict, ref: str) -> Any:
    node: Any = root
    for part in ref.lstrip("#").split("/"):
        if part:
            node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def schema_errors(value: Any, schema: Any, root: Any = None, where: str = "$") -> list[str]:
    """Every way `value` fails `schema` (empty when it validates)."""
    root = schema if root is None else root
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [f"{where}: no value is allowed here"]
    errors: list[str] = []
    if "$ref" in schema:
        errors += schema_errors(value, _resolve(root, schema["$ref"]), root, where)
    if "type" in schema and not _type_ok(value, schema["type"]):
        return errors + [f"{where}: expected {schema['type']}, got {json_type(value)}"]
    if isinstance(schema.get("enum"), list) and not any(
        json_equal(value, option) for option in schema["enum"]
    ):
        errors.append(f"{where}: {value!r} is not one of {schema['enum']!r}")
    if "const" in schema and not json_equal(value, schema["const"]):
        errors.append(f"{where}: {value!r} is not {schema['const']!r}")
    errors += _combinators(value, schema, root, where)
    kind = json_type(value)
    if kind == "object":
        errors += _object_errors(value, schema, root, where)
    elif kind == "array":
        errors += _array_errors(value, schema, root, where)
    elif kind == "string":
        errors += _string_errors(value, schema, where)
    elif kind in ("integer", "number"):
        errors += _number_errors(value, schema, where)
    return errors


def _combinators(value: Any, schema: dict, root: Any, where: str) -> list[str]:
    errors = []
    for sub in schema.get("allOf", []):
        errors += schema_errors(value, sub, root, where)
    if "anyOf" in schema and all(schema_errors(value, s, root, where) for s in schema["anyOf"]):
        errors.append(f"{where}: matches none of anyOf")
    if "oneOf" in schema:
        matches = sum(not schema_errors(value, s, root, where) for s in schema["oneOf"])
        if matches != 1:
            errors.append(f"{where}: matches {matches} of oneOf (exactly one wanted)")
    return errors


def _object_errors(value: dict, schema: dict, root: Any, where: str) -> list[str]:
    errors = [f"{where}: missing {key!r}" for key in schema.get("required", []) if key not in value]
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            errors += schema_errors(item, properties[key], root, f"{where}.{key}")
        elif extra is False:
            errors.append(f"{where}: unexpected property {key!r}")
        elif isinstance(extra, dict):
            errors += schema_errors(item, extra, root, f"{where}.{key}")
    if len(value) < schema.get("minProperties", 0):
        errors.append(f"{where}: fewer than {schema['minProperties']} properties")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(f"{where}: more than {schema['maxProperties']} properties")
    return errors


def _array_errors(value: list, schema: dict, root: Any, where: str) -> list[str]:
    errors = []
    prefix = schema.get("prefixItems", [])
    for index, item in enumerate(value):
        sub = prefix[index] if index < len(prefix) else schema.get("items", True)
        errors += schema_errors(item, sub, root, f"{where}[{index}]")
    if len(value) < schema.get("minItems", 0):
        errors.append(f"{where}: fewer than {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{where}: more than {schema['maxItems']} items")
    return errors


def _string_errors(value: str, schema: dict, where: str) -> list[str]:
    errors = []
    if len(value) < schema.get("minLength", 0):
        errors.append(f"{where}: shorter than {schema['minLength']}")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{where}: longer than {schema['maxLength']}")
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        errors.append(f"{where}: {value!r} does not match {schema['pattern']!r}")
    check = _FORMATS.get(schema.get("format", ""))
    if check is not None:
        try:
            ok = check(value)
        except ValueError:
            ok = False
        if not ok:
            errors.append(f"{where}: {value!r} is not a valid {schema['format']}")
    return errors


def _number_errors(value: float, schema: dict, where: str) -> list[str]:
    errors = []
    bounds = (
        ("minimum", lambda b: value >= b),
        ("maximum", lambda b: value <= b),
        ("exclusiveMinimum", lambda b: value > b),
        ("exclusiveMaximum", lambda b: value < b),
    )
    for keyword, within in bounds:
        if (
            keyword in schema
            and not isinstance(schema[keyword], bool)
            and not within(schema[keyword])
        ):
            errors.append(f"{where}: {value} fails {keyword} {schema[keyword]}")
    step = schema.get("multipleOf")
    if step and not math.isclose(value / step, round(value / step), abs_tol=1e-9):
        errors.append(f"{where}: {value} is not a multiple of {step}")
    return errors
