"""A Responses request made into the server's chat request, so both APIs share one pipeline.

Everything after this translation (rendering, tool-call and reasoning
parsing, sampling, constrained decoding) is /v1/chat/completions' own code,
so the same conversation gives the same prompt and the same sampling
whichever API carried it.

Input items become chat messages:
- `message` (role user, system, developer or assistant; text parts only),
- `function_call` joins the assistant message before it as a tool call (a
  model's text and its calls are one assistant turn in a chat template),
- `function_call_output` becomes a `tool` message,
- `reasoning` becomes the next assistant message's `reasoning_content`, which
  the templates of reasoning models (Kimi, GLM) render back.
`instructions` becomes a leading system message. Anything this server cannot
honour (images, item references) is a 400 naming the field, not silently
dropped; tools are read in responses_tools.py.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from engine.server.error_responses import APIError, bad_request, from_validation_error
from engine.server.protocol import ChatCompletionRequest
from engine.server.responses_protocol import ResponsesRequest, decode_reasoning
from engine.server.responses_tools import joined_name

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
_ITEM_TYPES = "message, function_call, function_call_output, reasoning"

# Chat request fields and the Responses fields they came from, so that a
# validation error names what the client actually sent.
_PARAM_NAMES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "response_format": "text.format",
}


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input as a list of items (a string is one user message)."""
    if request.input is None:
        return []
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}]
    return list(request.input)


def _text_of_parts(parts: Any, param: str) -> str:
    if isinstance(parts, str):
        return parts
    if not isinstance(parts, list):
        raise bad_request(f"{param} must be a string or a list of content parts", param=param)
    texts = []
    for index, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise bad_request(
                f"content part of type {kind!r} is not supported: this server takes text only "
                f"(input_text, output_text)",
                param=f"{param}.{index}",
            )
    return "".join(texts)


def _reasoning_text(item: dict[str, Any], param: str) -> str:
    """Reasoning content if given, else its summary, else our own reasoning token."""
    for field in ("content", "summary"):
        parts = item.get(field)
        if parts:
            return _text_of_parts(parts, f"{param}.{field}")
    return decode_reasoning(item.get("encrypted_content")) or ""


def _required_string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param}.{key} is required (a non-empty string)", param=f"{param}.{key}")
    return value


class _Conversation:
    """Chat messages built item by item, joining what a chat template sees as one turn."""

    def __init__(self, instructions: str | None) -> None:
        self.messages: list[dict[str, Any]] = []
        if instructions:
            self.messages.append({"role": "system", "content": instructions})
        self.reasoning: list[str] = []  # waiting for the assistant turn it belongs to

    def _assistant(self, content: str | None, join: bool) -> dict[str, Any]:
        last = self.messages[-1] if self.messages else None
        if join and last is not None and last["role"] == "assistant":
            message = last
        else:
            message = {"role": "assistant", "content": content}
            self.messages.append(message)
        if self.reasoning:
            texts = [message.get("reasoning_content") or "", *self.reasoning]
            message["reasoning_content"] = "\n\n".join(text for text in texts if text)
            self.reasoning = []
        return message

    def add(self, item: dict[str, Any], param: str) -> None:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise bad_request(
                    f"{param}.role must be one of {', '.join(_ROLES)}, not {role!r}",
                    param=f"{param}.role",
                )
            text = _text_of_parts(item.get("content", ""), f"{param}.content")
            if role == "assistant":
                self._assistant(text, join=False)
            else:
                self.messages.append({"role": role, "content": text})
        elif kind == "function_call":
            arguments = item.get("arguments", "")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            name = joined_name(item.get("namespace"), _required_string(item, "name", param))
            call = {
                "id": _required_string(item, "call_id", param),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            message = self._assistant(None, join=True)
            message.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = _text_of_parts(item.get("output", ""), f"{param}.output")
            call_id = _required_string(item, "call_id", param)
            self.messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            text = _reasoning_text(item, param)
            if text:
                self.reasoning.append(text)
        else:
            raise bad_request(
                f"input items of type {kind!r} are not supported by this server "
                f"(it takes {_ITEM_TYPES})",
                param=f"{param}.type",
            )


def chat_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    conversation = _Conversation(instructions)
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise bad_request("input items must be objects", param=f"input.{index}")
        conversation.add(item, f"input.{index}")
    if not conversation.messages:
        raise bad_request("the input has no messages", param="input")
    return conversation.messages


def _chat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict")}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def _chat_tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise bad_request(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}; '
        "this server has no hosted tools",
        param="tool_choice",
    )


def text_format(text: dict[str, Any] | None) -> dict[str, Any]:
    """`text.format`, checked, with OpenAI's default filled in (echoed in the response)."""
    fmt = (text or {}).get("format") or {"type": "text"}
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in ("text", "json_object", "json_schema"):
        raise bad_request(
            f"text.format.type must be text, json_object or json_schema, not {kind!r}",
            param="text.format.type",
        )
    if kind == "json_schema" and not isinstance(fmt.get("schema"), dict):
        raise bad_request("text.format.schema is required for json_schema", "text.format.schema")
    return fmt


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    """Chat's `response_format` for a `text.format`: json_schema's fields move one level down."""
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = {"name": fmt.get("name") or "response", "schema": fmt["schema"]}
    for key in ("description", "strict"):
        if fmt.get(key) is not None:
            schema[key] = fmt[key]
    return {"type": "json_schema", "json_schema": schema}


def _blamed_field(body: dict[str, Any]) -> str | None:
    """The field a request-wide check refused, found by leaving one out.

    Checks across fields (`response_format` other than text, for one) fail
    with no location; only `response_format` has a Responses name to give.
    """
    if "response_format" not in body:
        return None
    rest = {key: value for key, value in body.items() if key != "response_format"}
    try:
        ChatCompletionRequest.model_validate(rest)
    except ValidationError:
        return None
    return "response_format"


def _renamed(error: APIError, body: dict[str, Any]) -> APIError:
    """The error with chat's field names replaced by the Responses fields they came from."""
    chat_param = error.param or _blamed_field(body)
    if chat_param is None:
        return error
    head, _, rest = chat_param.partition(".")
    if head not in _PARAM_NAMES:
        return error
    # A message index is not an input item index (items merge), so name `input` alone.
    param = _PARAM_NAMES[head] + ("." + rest if rest and head != "messages" else "")
    return bad_request(error.message.replace(chat_param, param), param=param, code=error.code)


def chat_request(
    request: ResponsesRequest,
    items: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    fmt: dict[str, Any],
) -> ChatCompletionRequest:
    """The chat request that stands for `request`, whose input (history included) is `items`."""
    body: dict[str, Any] = {
        **request.extensions(),
        "model": request.model,
        "messages": chat_messages(items, request.instructions),
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "user": request.user,
    }
    if tools:
        body["tools"] = [_chat_tool(tool) for tool in tools]
    if request.tool_choice is not None:
        body["tool_choice"] = _chat_tool_choice(request.tool_choice)
    response_format = _response_format(fmt)
    if response_format is not None:
        body["response_format"] = response_format
    optional = {
        "max_completion_tokens": request.max_output_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as error:
        raise _renamed(from_validation_error(error), body) from error
