"""Which JSON Schema keywords constrained decoding can enforce, checked before compiling.

xgrammar turns a schema into a grammar, but some keywords it accepts and then
ignores (measured with xgrammar 0.2.9: an instance that violates them is still
generated). A grammar that ignores part of a schema could produce output that
fails it, which is exactly what `strict` promises will not happen, so those
keywords are refused with a message naming where they are:

- `not`, `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`,
  `dependencies`, `contains`/`minContains`/`maxContains`, `uniqueItems: true`:
  not enforced at all;
- `patternProperties`, `propertyNames`: in strict mode every property not
  named in `properties` is refused, so these would only ever allow `{}`;
- `allOf` with more than one schema: only the first is enforced;
- `minLength`/`maxLength` together with `pattern` or `format`: the lengths
  are dropped (xgrammar warns so), and an unbounded string is what a weak
  model then writes;
- `multipleOf` on anything but an integer: dropped likewise;
- `$ref` to anything but this document (`#...`): nothing is fetched.

Everything else that validates (types, `properties`, `required`,
`additionalProperties`, `items`/`prefixItems`, `enum`/`const`, `anyOf`/`oneOf`
(enforced as anyOf, so its branches should not overlap), string lengths,
`pattern`, `format`, numeric bounds and `multipleOf`, item and property
counts, local `$ref`/`$defs`) is enforced; annotations (`title`,
`description`, `default`, `examples`, ...) are ignored, as validators do.
"""

from __future__ import annotations

from typing import Any

from engine.grammar.spec import GrammarError

_NOT_ENFORCED = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
    "patternProperties",
    "propertyNames",
    "$dynamicRef",
    "$recursiveRef",
)
# Keywords whose value maps names to subschemas (a property may be called "not").
_NAME_MAPS = ("properties", "$defs", "definitions")
# Keywords whose value is one subschema, or a list of them.
_SUBSCHEMA = (
    "items",
    "additionalItems",
    "unevaluatedItems",
    "additionalProperties",
    "unevaluatedProperties",
)
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")
# Deeper than this is not a schema anyone writes by hand; it is refused before
# Python's own recursion limit turns it into a server error.
MAX_DEPTH = 64


def check_schema(schema: Any, where: str = "schema") -> None:
    """Raise GrammarError naming the first keyword that cannot be enforced."""
    _check(schema, where, 0)


def _check(node: Any, where: str, depth: int) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        raise GrammarError(f"{where}: a schema must be an object or a boolean", param=where)
    if depth > MAX_DEPTH:
        raise GrammarError(f"{where}: the schema nests deeper than {MAX_DEPTH} levels", param=where)
    for keyword in _NOT_ENFORCED:
        if keyword in node:
            _refuse(where, keyword)
    if node.get("uniqueItems") is True:
        _refuse(where, "uniqueItems")
    lengths = [k for k in ("minLength", "maxLength") if k in node]
    shaped = [k for k in ("pattern", "format") if k in node]
    if lengths and shaped:
        _refuse(where, f"{lengths[0]} together with {shaped[0]}")
    if "multipleOf" in node and node.get("type") != "integer":
        _refuse(where, "multipleOf on a non-integer type (say type: integer)")
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) > 1:
        _refuse(where, "allOf with more than one schema")
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        _refuse(where, f"$ref {ref!r} (only references inside the schema, '#/...')")
    for keyword in _NAME_MAPS:
        members = node.get(keyword)
        if isinstance(members, dict):
            for name, sub in members.items():
                _check(sub, f"{where}.{keyword}.{name}", depth + 1)
    for keyword in _SUBSCHEMA:
        sub = node.get(keyword)
        if isinstance(sub, list):  # draft-4 tuple form of items
            for index, item in enumerate(sub):
                _check(item, f"{where}.{keyword}.{index}", depth + 1)
        elif sub is not None:
            _check(sub, f"{where}.{keyword}", depth + 1)
    for keyword in _SUBSCHEMA_LISTS:
        subs = node.get(keyword)
        if subs is None:
            continue
        if not isinstance(subs, list) or not subs:
            raise GrammarError(f"{where}.{keyword} must be a non-empty array", param=where)
        for index, sub in enumerate(subs):
            _check(sub, f"{where}.{keyword}.{index}", depth + 1)


def _refuse(where: str, keyword: str) -> None:
    raise GrammarError(
        f"{where}: {keyword} is not supported by constrained decoding (the grammar "
        "cannot enforce it); remove it, or check that part after generation",
        param=where,
    )
