"""Reading the header of a Kimi tool call: which tool, and the model's call counter.

Kimi writes `functions.NAME:IDX`, and its chat template writes the ids of
earlier calls back into the history verbatim. Clients that rewrite those ids
teach the model other shapes, all seen in practice:

- `functions.NAME:IDX` (or `functions.NAME`): the tool is NAME;
- `NAME:IDX` or `NAME` where NAME is one of the request's tools: that tool;
- anything else (`0`, `call_3`, `toolu_01...`, a UUID): an id that names no
  tool. With one tool in the request it is that tool; with several, the
  arguments decide (`schema_match`), once they are complete.

Without request tools to compare against, `NAME:IDX` is still read as NAME
(the model's own format minus the prefix), but a header without a counter or
a prefix, or a bare number, names nothing.

The call id returned to the client is always Kimi's own form,
`functions.NAME:IDX`, so the next turn's history shows the model its format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.chat.tool_parsers.base import is_valid_tool_name

_PREFIX = "functions."
_COUNTED = re.compile(r"(?P<name>.+?):(?P<index>\d+)")


@dataclass(frozen=True)
class CallHeader:
    name: str | None  # None: the header names no tool; the arguments must tell
    index: int | None  # the model's call counter, when it wrote one


def _counted(text: str) -> tuple[str, int | None]:
    match = _COUNTED.fullmatch(text)
    if match is None:
        return text, None
    return match["name"], int(match["index"])


def read_header(header: str, tool_names: frozenset[str]) -> CallHeader:
    """What a (stripped) call header says; see the module doc for the rules."""
    if header.isdecimal():  # not isdigit: "²" is a digit that int() refuses
        return CallHeader(None, int(header))
    if header.startswith(_PREFIX):
        name, index = _counted(header[len(_PREFIX) :])
        if is_valid_tool_name(name):
            return CallHeader(name, index)
        return CallHeader(None, index)
    name, index = _counted(header)
    if name in tool_names:
        return CallHeader(name, index)
    if not tool_names and index is not None and is_valid_tool_name(name) and not name.isdigit():
        return CallHeader(name, index)
    return CallHeader(None, None)


def call_id(name: str, index: int) -> str:
    return f"{_PREFIX}{name}:{index}"
