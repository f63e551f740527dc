"""Which of the request's tools a call's arguments were written for.

Kimi's chat template writes each earlier call's id into the history verbatim,
so when a client replaces the `functions.NAME:IDX` ids the server returned
with its own (`call_3`, `toolu_01...`, a bare `0`), the model imitates them and
its next call's header carries no tool name. The name then has to come from
the arguments: the one tool whose parameter schema they satisfy.

Agent tool sets share argument names (`path` in read, list and grep), so a
loose match would hand the client a call to a tool the model did not choose.
The rules are therefore strict, and ambiguity means no match:

- every required key present, every value of the declared type, enum and
  const respected (recursively, through properties, items, anyOf/oneOf/allOf);
- at the top level, no key the schema does not declare, unless it allows
  extra keys (`additionalProperties` true or a schema, or `patternProperties`);
- a tool without parameters takes only `{}`.

Keywords that narrow values further (lengths, patterns, `$ref`) are not
checked: they cannot make a second tool fit, only rule one out, and reading
them wrongly would drop a good call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def _is_integer(value: Any) -> bool:
    # JSON Schema counts 2.0 as an integer; Python counts True as one, JSON does not.
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def _type_fits(value: Any, declared: Any) -> bool:
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list):
        return True
    checks = [_TYPE_CHECKS[name] for name in names if name in _TYPE_CHECKS]
    return not checks or any(check(value) for check in checks)


def _same(a: Any, b: Any) -> bool:
    # JSON equality: True is not 1, although Python says it is.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b


def fits(value: Any, schema: Any) -> bool:
    """Whether value satisfies schema, as far as the keywords above are checked."""
    if schema is True or schema is None:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict):
        return True
    if "type" in schema and not _type_fits(value, schema["type"]):
        return False
    if "const" in schema and not _same(value, schema["const"]):
        return False
    if isinstance(schema.get("enum"), list) and not any(_same(value, c) for c in schema["enum"]):
        return False
    if isinstance(value, dict) and not _object_fits(value, schema):
        return False
    if isinstance(value, list) and "items" in schema:
        items = schema["items"]
        if isinstance(items, dict | bool) and not all(fits(v, items) for v in value):
            return False
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and options and not any(fits(value, o) for o in options):
            return False
    options = schema.get("allOf")
    return not isinstance(options, list) or all(fits(value, o) for o in options)


def _object_fits(value: dict, schema: dict) -> bool:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    if isinstance(required, list) and any(key not in value for key in required):
        return False
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            if not fits(item, properties[key]):
                return False
        elif not fits(item, extra):
            return False
    return True


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
