"""Bounds for numbers a schema leaves unbounded, so a weak model cannot write digits forever.

JSON Schema lets an integer have any number of digits, and the grammar
follows: measured on the default model, greedy calls to the agent's `read`
tool wrote `"limit": 1000000000000...` until the token budget ran out, in 11
of 50 answers. Every tool the engine serves reads numbers into 64-bit
integers or doubles anyway, so where a schema gives no bound the grammar
gets one:

- `integer`: the int64 range, [-2**63, 2**63 - 1];
- `number`: [-1e15, 1e15] (with a bound, xgrammar also writes decimals
  plainly, without an exponent and with at most a dozen fraction digits).

This only narrows what the grammar allows: everything it still allows
validates against the original schema (which `engine.chat.json_schema`
checks in the tests), it just cannot be absurdly long.
"""

from __future__ import annotations

from typing import Any

INTEGER_RANGE = (-(2**63), 2**63 - 1)
NUMBER_RANGE = (-1e15, 1e15)
_NAME_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMAS = (
    "items",
    "additionalItems",
    "unevaluatedItems",
    "additionalProperties",
    "unevaluatedProperties",
    "prefixItems",
    "anyOf",
    "oneOf",
    "allOf",
)


def _types(node: dict[str, Any]) -> set[str]:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    return set(declared) if isinstance(declared, list) else set()


def bound_numbers(schema: Any) -> Any:
    """A copy of `schema` with the missing numeric bounds filled in (see the module doc)."""
    if isinstance(schema, list):
        return [bound_numbers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    node = dict(schema)
    for keyword in _NAME_MAPS:
        if isinstance(node.get(keyword), dict):
            node[keyword] = {name: bound_numbers(sub) for name, sub in node[keyword].items()}
    for keyword in _SUBSCHEMAS:
        if keyword in node:
            node[keyword] = bound_numbers(node[keyword])
    types = _types(node)
    if "enum" in node or "const" in node or not types & {"integer", "number"}:
        return node
    low, high = NUMBER_RANGE if "number" in types else INTEGER_RANGE
    if "minimum" not in node and "exclusiveMinimum" not in node:
        node["minimum"] = low
    if "maximum" not in node and "exclusiveMaximum" not in node:
        node["maximum"] = high
    return node
