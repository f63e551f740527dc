"""Rendering a checkpoint's Jinja chat template the way transformers does, without transformers.

Templates come with the checkpoint, so they are untrusted: they run in
Jinja's immutable sandbox and only ever see plain JSON data (dicts, lists,
strings, numbers), never the caller's objects. The environment matches what
Hugging Face templates are written against: `trim_blocks` and
`lstrip_blocks`, loop controls, a `tojson` that does not HTML-escape and
takes `indent`/`separators`/`sort_keys`, `raise_exception`, `strftime_now`,
and the `{% generation %}` block (rendered as its plain content here).
Messages get the same normalisation transformers 5 applies: keys whose value
is None are dropped, and reasoning given as `reasoning` or `thinking` is also
offered as `reasoning_content`, the name templates read.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import numpy as np
from jinja2.sandbox import ImmutableSandboxedEnvironment

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Appended to the final message for continue_final_message, then cut off with
# everything after it (the template's end-of-turn markers).
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; render it as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=16)
def compile_chat_template(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment.from_string(template)


def plain_data(value: Any) -> Any:
    """value rebuilt from JSON types only, so the sandboxed template cannot reach any object's methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        return {plain_data(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(item) for item in value]
    if isinstance(value, np.generic):  # np.bool_(False) must not become a truthy placeholder
        return plain_data(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (OpenAI SDK messages)
        return plain_data(value.model_dump())
    return f"<{type(value).__name__}>"


def _normalise_message(message: Any) -> dict:
    data = plain_data(message)
    if not isinstance(data, dict):
        raise TypeError(f"chat messages must be dicts, got {message!r}")
    data = {key: value for key, value in data.items() if value is not None}
    reasoning = next((data[key] for key in _REASONING_FIELDS if key in data), None)
    if reasoning is not None:
        data = {"thinking": reasoning, **data, "reasoning_content": reasoning}
    return data


def _tool_schema(tool: dict | Callable) -> dict:
    if isinstance(tool, Mapping):
        return dict(tool)
    if inspect.isfunction(tool) or inspect.ismethod(tool):
        from transformers.utils import get_json_schema

        return get_json_schema(tool)
    raise ValueError(
        "tools must be JSON schemas (dicts) or functions with type hints and a docstring"
    )


def render_chat_template(
    template: str,
    messages: list,
    *,
    tools: list | None = None,
    documents: list | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    **variables: Any,
) -> str:
    """The conversation as text, exactly as the template writes it.

    `variables` reach the template as globals (special tokens, `thinking`,
    `enable_thinking`, ...). `continue_final_message` leaves the last message
    open (True continues `content`; a string names the field to continue).
    """
    if not messages:
        raise ValueError("cannot render an empty conversation")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be set")
    chat = [_normalise_message(message) for message in messages]
    schemas = None if tools is None else [plain_data(_tool_schema(tool)) for tool in tools]
    final_text = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_text = _tag_final_message(chat[-1], field, template)
    text = compile_chat_template(template).render(
        messages=chat,
        tools=schemas,
        documents=plain_data(documents),
        add_generation_prompt=add_generation_prompt,
        **plain_data(variables),
    )
    if final_text is None:
        return text
    return _cut_at_tag(text, final_text)


def _tag_final_message(message: dict, field: str, template: str) -> str:
    """Append the continue tag to the final message's text; return that text (untagged)."""
    value = message.get(field)
    if value is None:
        raise ValueError(f"continue_final_message: the final message has no {field!r} to continue")
    fields = [field]
    if field in _REASONING_FIELDS:
        # Reasoning is offered under several names; tag each copy, whichever the template reads.
        fields = [name for name in _REASONING_FIELDS if message.get(name) == value]
    if not any(name in template for name in fields):
        raise ValueError(f"continue_final_message: the chat template never reads {field!r}")
    if isinstance(value, list):
        for block in reversed(value):
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                final_text = block["text"]
                block["text"] = final_text + _CONTINUE_TAG
                return final_text
        raise ValueError("continue_final_message: the final message has no text block to continue")
    for name in fields:
        message[name] = str(message[name]) + _CONTINUE_TAG
    return str(value)


def _cut_at_tag(text: str, final_text: str) -> str:
    tag = _CONTINUE_TAG.strip()
    if tag not in text or final_text.strip() not in text:
        raise ValueError("continue_final_message: the template dropped the final message's text")
    at = text.rindex(tag)
    if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
        return text[:at]
    # The template trimmed trailing whitespace after the message, so trim ours too.
    return text[:at].rstrip()
