"""Is it a JSON Schema at all? The check every tool schema gets when a request arrives.

A tool's `parameters` (`input_schema` on /v1/messages) is used three ways:
rendered into the prompt, compiled into a grammar when `tool_choice` asks
for a call, and read by the tool parsers to type and name calls. Only the
grammar used to look at it closely, so `{"type": "nonsense"}` was accepted
with `tool_choice` auto and refused only with `required`. OpenAI and
Anthropic check every tool's schema against the JSON Schema meta-schema up
front; so does this, by hand (the `jsonschema` package is not a dependency,
see engine.chat.json_schema), for what any draft from 4 to 2020-12 allows:

- a schema is an object or a boolean;
- `type` is one of the seven type names, or a non-empty list of them without repeats;
- keywords that hold a schema, a list of schemas or a map of names to
  schemas hold those (checked in turn, to MAX_DEPTH levels);
- counts (`minLength`, `maxItems`, ...) are non-negative integers, bounds
  are numbers (or booleans for draft 4's exclusive bounds), `multipleOf` is
  above zero;
- `required` is a list of strings, `enum` and `examples` are lists, names
  and annotations (`$ref`, `pattern`, `format`, `title`, ...) are strings.

Keywords no draft defines are annotations, as validators treat them. Whether
constrained decoding can enforce a valid schema is another question, asked
only when a grammar is built (schema_support.py).
"""

from __future__ import annotations

from typing import Any

from engine.grammar.schema_support import MAX_DEPTH
from engine.grammar.spec import GrammarError

TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_ONE_SCHEMA = (
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("$defs", "definitions", "dependentSchemas", "patternProperties", "properties")
_COUNTS = (
    "maxContains",
    "maxItems",
    "maxLength",
    "maxProperties",
    "minContains",
    "minItems",
    "minLength",
    "minProperties",
)
_STRINGS = (
    "$anchor",
    "$comment",
    "$dynamicAnchor",
    "$dynamicRef",
    "$id",
    "$ref",
    "$schema",
    "contentEncoding",
    "contentMediaType",
    "description",
    "format",
    "pattern",
    "title",
)
_BOOLEANS = ("deprecated", "readOnly", "uniqueItems", "writeOnly")


def check_json_schema(schema: Any, where: str) -> None:
    """Raise GrammarError, its param the dotted path of the problem under `where`
    (`tools.0.function.parameters.properties.x.type`), unless `schema` is a JSON Schema."""
    _check(schema, where, 0)


def _fail(where: str, message: str) -> GrammarError:
    return GrammarError(f"{where}: {message} (not a valid JSON Schema)", param=where)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    # 2.0 is an integer to JSON Schema; True is not.
    integral = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return _is_number(value) and integral and value >= 0


def _string_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _check_type(value: Any, where: str) -> None:
    names = value if isinstance(value, list) else [value]
    if isinstance(value, list) and not value:
        raise _fail(where, "an empty list of types")
    for name in names:
        if name not in TYPES:
            raise _fail(where, f"{name!r} is not a type; the types are {', '.join(TYPES)}")
    if len(set(names)) != len(names):
        raise _fail(where, "a type is listed twice")


def _check(node: Any, where: str, depth: int) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise _fail(where, f"a schema must be an object or a boolean, not {type(node).__name__}")
    if depth > MAX_DEPTH:
        raise _fail(where, f"the schema nests deeper than {MAX_DEPTH} levels")
    if "type" in node:
        _check_type(node["type"], f"{where}.type")
    for key in _COUNTS:
        if key in node and not _is_count(node[key]):
            raise _fail(f"{where}.{key}", "must be a non-negative integer")
    for key in ("minimum", "maximum"):
        if key in node and not _is_number(node[key]):
            raise _fail(f"{where}.{key}", "must be a number")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if key in node and not (_is_number(node[key]) or isinstance(node[key], bool)):
            raise _fail(f"{where}.{key}", "must be a number")
    if "multipleOf" in node and not (_is_number(node["multipleOf"]) and node["multipleOf"] > 0):
        raise _fail(f"{where}.multipleOf", "must be a number above zero")
    for key in _STRINGS:
        if key in node and not isinstance(node[key], str):
            raise _fail(f"{where}.{key}", "must be a string")
    for key in _BOOLEANS:
        if key in node and not isinstance(node[key], bool):
            raise _fail(f"{where}.{key}", "must be true or false")
    if "required" in node and not _string_list(node["required"]):
        raise _fail(f"{where}.required", "must be a list of property names")
    for key in ("enum", "examples"):
        if key in node and not isinstance(node[key], list):
            raise _fail(f"{where}.{key}", "must be a list")
    required_by = node.get("dependentRequired", {})
    if not isinstance(required_by, dict) or not all(map(_string_list, required_by.values())):
        raise _fail(f"{where}.dependentRequired", "must map names to lists of names")
    _check_subschemas(node, where, depth + 1)


def _check_subschemas(node: dict[str, Any], where: str, depth: int) -> None:
    for key in _ONE_SCHEMA:
        if key in node:
            _check(node[key], f"{where}.{key}", depth)
    items = node.get("items")
    if isinstance(items, list):  # drafts 4 to 2019-09: one schema per position
        for index, item in enumerate(items):
            _check(item, f"{where}.items.{index}", depth)
    elif "items" in node:
        _check(items, f"{where}.items", depth)
    for key in _SCHEMA_LISTS:
        if key not in node:
            continue
        members = node[key]
        if not isinstance(members, list) or not members:
            raise _fail(f"{where}.{key}", "must be a non-empty list of schemas")
        for index, member in enumerate(members):
            _check(member, f"{where}.{key}.{index}", depth)
    for key in _SCHEMA_MAPS:
        if key not in node:
            continue
        members = node[key]
        if not isinstance(members, dict):
            raise _fail(f"{where}.{key}", "must be an object of schemas")
        for name, member in members.items():
            _check(member, f"{where}.{key}.{name}", depth)
    dependencies = node.get("dependencies", {})  # draft 7: a schema or a list of names each
    if not isinstance(dependencies, dict):
        raise _fail(f"{where}.dependencies", "must be an object")
    for name, member in dependencies.items():
        if not _string_list(member):
            _check(member, f"{where}.dependencies.{name}", depth)
