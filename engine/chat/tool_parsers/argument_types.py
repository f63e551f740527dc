"""Typing GLM's textual argument values with the request's tool schemas.

GLM writes each argument as text between `<arg_value>` tags: strings as they
are, anything else as JSON (its template does `v | tojson if v is not string
else v`). So `5` may be the integer 5 or the string "5"; only the tool's JSON
schema can tell. The rules:

- Schema says only `string`: the text, verbatim.
- Schema allows no `string` (integer, number, boolean, object, array, null):
  the text parsed as JSON. GLM-4.7 sometimes writes such a value as it would
  appear inside a JSON string: with backslash-escaped quotes
  (`[{\\"id\\": 1}]`), or quoted whole (`"[1, 2]"`); both are read as the
  JSON they hold. `True`/`False`/`None` are read as the boolean or null the
  schema asks for. Text that still does not parse stays a string, and the
  agent's schema validation reports it to the model.
- Schema allows `string` and other types (e.g. `["string", "null"]`): the
  parsed JSON value if its type is one of the others, else the text.
- No schema for this argument (unknown tool or key, or no `type`): the parsed
  value if the text is a JSON object, array, number, boolean or null, else the
  text. A JSON string literal (`"x"`, quotes included) stays text, quotes and
  all, because GLM never quotes a string value. null is included so that a
  None the template rendered comes back as None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.chat.json_schema import json_type
from engine.chat.tool_parsers.base import loads_strict

# Without a schema, only text starting like one of these can become non-string JSON.
UNTYPED_JSON_STARTS = frozenset("{[-0123456789tfn")

_JSON_TYPE_NAMES = ("string", "integer", "number", "boolean", "object", "array", "null")


def _schema_types(schema: Any) -> frozenset[str]:
    """The JSON types a property schema allows; empty when it does not say."""
    if not isinstance(schema, dict):
        return frozenset()
    declared = schema.get("type")
    if isinstance(declared, str):
        return frozenset({declared}) & frozenset(_JSON_TYPE_NAMES)
    if isinstance(declared, list):
        return frozenset(t for t in declared if t in _JSON_TYPE_NAMES)
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or []:
            option_types = _schema_types(option)
            if not option_types:
                return frozenset()  # an untyped alternative: anything goes
            types |= option_types
    if types:
        return frozenset(types)
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
        return frozenset({"string"})
    return frozenset()


def _allowed(value_type: str, types: frozenset[str]) -> bool:
    return value_type in types or (value_type == "integer" and "number" in types)


class ArgumentTypes:
    """Looks up the JSON types of each tool's parameters."""

    def __init__(self, tools: Sequence[dict[str, Any]]) -> None:
        self._properties: dict[str, dict[str, Any]] = {}
        for tool in tools:
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                continue
            parameters = function.get("parameters")
            properties = parameters.get("properties") if isinstance(parameters, dict) else None
            if isinstance(properties, dict):
                self._properties[function["name"]] = properties

    def types_of(self, tool_name: str, key: str) -> frozenset[str]:
        """Allowed JSON types of one argument; empty when no schema says."""
        return _schema_types(self._properties.get(tool_name, {}).get(key))


def is_string_only(types: frozenset[str]) -> bool:
    return types == frozenset({"string"})


def may_be_untyped_json(text: str) -> bool:
    """Without a schema: could this value text (so far) turn out to be non-string JSON?"""
    stripped = text.lstrip()
    return not stripped or stripped[0] in UNTYPED_JSON_STARTS


_UNPARSED = object()
_PYTHON_WORDS = {"True": ("boolean", True), "False": ("boolean", False), "None": ("null", None)}


def _parse(text: str) -> Any:
    try:
        return loads_strict(text)
    except ValueError:
        return _UNPARSED


def _repaired(text: str, types: frozenset[str]) -> Any:
    """A non-string value written the ways GLM gets wrong (see module doc), or _UNPARSED."""
    if '\\"' in text:
        # Only the quotes are escaped: a `\\` in such text is already JSON's
        # escaped backslash, so decoding the whole as a string body would
        # leave a Windows path's `\U` as an invalid escape.
        value = _parse(text.replace('\\"', '"'))
        if value is not _UNPARSED:
            return value
    word = _PYTHON_WORDS.get(text.strip())
    if word is not None and word[0] in types:
        return word[1]
    return _UNPARSED


def convert_value(text: str, types: frozenset[str]) -> Any:
    """The argument value GLM meant by `text`, given its allowed types (see module doc)."""
    if is_string_only(types):
        return text
    value = _parse(text)
    if types and "string" not in types:
        if value is _UNPARSED:
            value = _repaired(text, types)
        if isinstance(value, str):  # JSON quoted as a string: read what it holds
            inner = _parse(value)
            if inner is not _UNPARSED and _allowed(json_type(inner), types):
                value = inner
        return text if value is _UNPARSED else value
    if value is _UNPARSED:
        return text
    value_type = json_type(value)
    if not types:
        return text if value_type == "string" else value
    return value if value_type != "string" and _allowed(value_type, types) else text
