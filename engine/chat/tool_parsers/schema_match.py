"""Which of the request's tools a call's arguments were written for.

Kimi's chat template writes each earlier call's id into the history verbatim,
so when a client replaces the `functions.NAME:IDX` ids the server returned
with its own (`call_3`, `toolu_01...`, a bare `0`), the model imitates them and
its next call's header carries no tool name. The name then has to come from
the arguments: the one tool whose parameter schema they satisfy.

Agent tool sets share argument names (`path` in read, list and grep), so a
loose match would hand the client a call to a tool the model did not choose.
The rules are therefore strict, and ambiguity means no match:

- the arguments valid against the schema (required keys, types, enum and
  const, lengths, patterns, bounds, local `$ref`, recursively);
- at the top level, no key the schema does not declare, unless it allows
  extra keys (`additionalProperties` true or a schema, or `patternProperties`);
- a tool without parameters takes only `{}`.

The values are checked by the engine's JSON Schema checker
(`engine/chat/json_schema.py`). A schema it cannot read (a regular expression
Python does not accept, a `$ref` that leads nowhere) rules its tool out for
this purpose: a name is only ever inferred from a schema that was checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from engine.chat.json_schema import schema_errors


def fits(value: Any, schema: Any) -> bool:
    """Whether value satisfies schema; False too when the schema cannot be read."""
    try:
        return not schema_errors(value, schema)
    except (re.error, LookupError, TypeError, ValueError, AttributeError):
        return False


def _declared_keys(schema: dict) -> set[str]:
    properties = schema.get("properties")
    keys = set(properties) if isinstance(properties, dict) else set()
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key) or []:
            if isinstance(option, dict):
                keys |= _declared_keys(option)
    return keys


def _allows_undeclared(schema: dict) -> bool:
    extra = schema.get("additionalProperties")
    return extra is True or isinstance(extra, dict) or bool(schema.get("patternProperties"))


def arguments_fit(arguments: dict[str, Any], parameters: Any) -> bool:
    """Whether a call's arguments fit a tool's `parameters` schema (see module doc)."""
    if parameters is None or parameters is True:
        return not arguments
    if not isinstance(parameters, dict):
        return False
    if not _allows_undeclared(parameters) and set(arguments) - _declared_keys(parameters):
        return False
    return fits(arguments, parameters)


def tool_functions(tools: Sequence[Any]) -> list[dict[str, Any]]:
    """The `function` objects of OpenAI tool entries that have a name."""
    functions = []
    for tool in tools:
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            functions.append(function)
    return functions


def matching_tools(arguments: dict[str, Any], tools: Sequence[Any]) -> list[str]:
    """Names of the tools whose parameters the arguments fit, in the request's order."""
    return [
        function["name"]
        for function in tool_functions(tools)
        if arguments_fit(arguments, function.get("parameters"))
    ]
