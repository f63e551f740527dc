"""Text the agent keeps and writes is valid Unicode: a lone surrogate becomes U+FFFD.

A Python string can hold half of a UTF-16 surrogate pair on its own (U+D800 to
U+DFFF). JSON's `"\\ud800"` decodes to one, so a server can stream one in a
model's text, its reasoning or its tool arguments (the in-process engine's
text is Python text too); an editor's JSON-RPC can carry one in a prompt; file
names that are not UTF-8 come back from the file system as `surrogateescape`
ones. No UTF-8 writer takes such a string: pydantic's `model_dump_json` (the
events journal, `resident run --json`), a journal opened as UTF-8, httpx's
JSON request body and a hook's stdin all raise on it, and one bad character
would cost a session its journal or a task its next request.

One policy, applied where text enters the agent: the model's stream
(agent/core/clients/valid_stream.py, read by the loop and compaction), the
user's task (loop.py) and every tool result (tool_runner.py) have each lone
surrogate replaced by U+FFFD, the replacement character, and are otherwise
kept as they were; the conversation and the events then hold valid Unicode.
A high and a low surrogate side by side (a pair sent as two escapes, or split
across two stream chunks) are joined into the character they encode. Where
JSON leaves the agent (the journals, `--json`, request bodies, hook payloads)
the same replacement is a net for text that came in some other way
(`json_text`, `model_json`), so nothing written ever raises on it. Terminals
show such characters escaped instead (agent/terminal_text.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR_OR_LONE = re.compile("([\ud800-\udbff][\udc00-\udfff])|[\ud800-\udfff]")
# `\uD800`-`\uDFFF` written as a JSON escape: decoded, it may be a lone surrogate.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89abcdefABCDEF]")


def is_high_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udbff"


def _mend(found: re.Match[str]) -> str:
    pair = found.group(1)
    if pair is None:
        return REPLACEMENT
    return chr(0x10000 + ((ord(pair[0]) - 0xD800) << 10) + (ord(pair[1]) - 0xDC00))


def valid_text(text: str) -> str:
    """`text` with each lone surrogate as U+FFFD (a high one followed by a low one
    joined into their character); `text` itself when it holds none."""
    if _SURROGATE.search(text) is None:
        return text
    return _PAIR_OR_LONE.sub(_mend, text)


def valid_json(value: Any) -> Any:
    """A JSON-shaped value (dicts, lists, strings, numbers) with `valid_text` applied
    to every string, keys included; the very same object when nothing changed."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        pairs = [(valid_json(key), valid_json(item)) for key, item in value.items()]
        if all(
            new_key is key and new is item
            for (new_key, new), (key, item) in zip(pairs, value.items(), strict=True)
        ):
            return value
        return dict(pairs)
    if isinstance(value, list | tuple):
        items = [valid_json(item) for item in value]
        if all(new is item for new, item in zip(items, value, strict=True)):
            return value
        return items if isinstance(value, list) else tuple(items)
    return value


def valid_arguments(raw: str) -> str:
    """A tool call's argument text whose JSON decodes to no lone surrogate: one
    written out, or escaped (`{"path": "\\ud800"}`), is U+FFFD. Such arguments are
    decoded, mended and encoded again; all others are kept as the model wrote them.
    Text that is not JSON keeps its escapes (the call is refused as malformed, and
    the history keeps `{}` for it: tool_runner.history_arguments)."""
    text = valid_text(raw)
    if _ESCAPED_SURROGATE.search(text) is None:
        return text
    try:
        value = json.loads(text)
        mended = valid_json(value)
    except (ValueError, RecursionError):  # RecursionError: nested absurdly deep
        return text
    if mended is value:  # escaped pairs, or `\\ud800` after an escaped backslash
        return text
    return json.dumps(mended, ensure_ascii=False)


def json_text(value: Any, **options: Any) -> str:
    """`json.dumps(value, ensure_ascii=False, **options)` that a UTF-8 writer always
    takes: a lone surrogate can only sit inside a JSON string, where U+FFFD in its
    place keeps the document valid."""
    return valid_text(json.dumps(value, ensure_ascii=False, **options))


def model_json(model: BaseModel) -> str:
    """`model.model_dump_json()`, with a lone surrogate in any field written as U+FFFD
    instead of pydantic's serialization error."""
    try:
        return model.model_dump_json()
    except ValueError:  # PydanticSerializationError: "surrogates not allowed"
        return json_text(model.model_dump(mode="json"), separators=(",", ":"))
