"""JSON from outside the server, read with limits on its shape: nesting depth and finite numbers.

`json.loads` follows nesting by recursion, so `[[[[...]]]]` 100,000 deep ends
in RecursionError, which nothing expects: a request body or a tool call's
arguments of that shape was a 500, or a crash of whatever read it. And a
number like `1e400` is valid JSON that Python reads as `inf` (`json.loads`
also takes the non-JSON words `NaN` and `Infinity`), which then flows into
sampling or into a prompt as text no JSON reader accepts.

Every reader of outside JSON in the engine goes through here: request bodies
(server/request_body.py), tool-call arguments a model wrote (the tool
parsers' `loads_strict`) and the arguments of calls in a request's history
(rendering, Anthropic blocks). A value deeper than MAX_JSON_DEPTH, or holding
a number that is not finite, is a JsonShapeError, a ValueError, so callers
that already handle bad JSON handle it too.

The depth bound is the Ruby JSON gem's default and well above anything an
API client sends (an Anthropic tool_use input sits 5 levels down, a tool
schema nests two levels per schema level), while low enough that every
recursive walk after parsing (schema checks, templates, validators) stays far
from Python's recursion limit.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_JSON_DEPTH = 100
# A path in an error names at most this many steps, then an ellipsis.
_PATH_STEPS = 8
# Element types a list may hold without being walked: nothing below them can be
# deep or non-finite (bool is a subclass of int but its own type here).
_FLAT = frozenset({int, str, bool, type(None)})


class JsonShapeError(ValueError):
    """Valid JSON, but nested too deeply or holding a number that is not finite.

    `path` names where, dotted as API params are (`messages.0.content`), when known.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


def _dotted(path: tuple[Any, ...]) -> str:
    steps = [str(step) for step in path[:_PATH_STEPS]]
    return ".".join(steps) + (".…" if len(path) > _PATH_STEPS else "")


def _not_finite(path: tuple[Any, ...], value: float) -> JsonShapeError:
    where = _dotted(path)
    message = (
        f"{value} is not a finite number (NaN, Infinity and numbers beyond about 1.8e308 "
        "cannot be used)"
    )
    return JsonShapeError(f"{where}: {message}" if where else message, where or None)


def _too_deep(path: tuple[Any, ...], max_depth: int) -> JsonShapeError:
    where = _dotted(path)
    message = f"the JSON nests deeper than {max_depth} levels"
    return JsonShapeError(f"{message} (at {where})" if where else message, where or None)


def check_shape(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise JsonShapeError when `value` (parsed JSON) nests deeper than `max_depth`
    containers or holds a float that is not finite. Iterative, so any depth is safe."""
    if isinstance(value, float) and not math.isfinite(value):
        raise _not_finite((), value)
    stack: list[tuple[Any, tuple[Any, ...]]] = []
    if isinstance(value, dict | list):
        stack.append((value, ()))
    while stack:
        node, path = stack.pop()
        if len(path) >= max_depth:  # `node` is container number len(path) + 1 on its path
            raise _too_deep(path, max_depth)
        if isinstance(node, dict):
            items: Any = node.items()
        elif _FLAT.issuperset(set(map(type, node))):
            continue  # e.g. a long list of token ids: nothing to look at inside
        else:
            items = enumerate(node)
        for key, item in items:
            if isinstance(item, dict | list):
                stack.append((item, (*path, key)))
            elif isinstance(item, float) and not math.isfinite(item):
                raise _not_finite((*path, key), item)


def loads_bounded(text: str | bytes, max_depth: int = MAX_JSON_DEPTH, strict: bool = False) -> Any:
    """json.loads for outside text, with check_shape on the result.

    Raises ValueError: json.JSONDecodeError for text that is not JSON,
    JsonShapeError for JSON of the wrong shape. `strict` also refuses the
    words NaN and Infinity at parse time, as RFC 8259 does (otherwise they are
    read and then refused by check_shape, with their path)."""
    try:
        value = json.loads(text, parse_constant=_reject_constant) if strict else json.loads(text)
    except RecursionError:
        raise _too_deep((), max_depth) from None
    check_shape(value, max_depth)
    return value


def _reject_constant(name: str) -> Any:
    # NaN and Infinity are Python extensions, not JSON; a client would choke on them.
    raise ValueError(f"{name} is not valid JSON")
