"""A Messages request as the server's chat request, and an engine result as Messages fields.

The request becomes a ChatCompletionRequest, so an Anthropic client's prompt
goes through exactly the rendering, tool prompting, output parsing and
sampling an OpenAI client's does:
- `system` (a string or text blocks) becomes the system message, and a
  `system` turn inside `messages` (Claude Code sends its reminders so) a
  system message in its place;
- a user turn's `tool_result` blocks become `tool` messages (in place, so the
  text around them keeps its order) and its text blocks user messages;
- an assistant turn's `tool_use` blocks become `tool_calls`, its `thinking`
  blocks `reasoning_content` (which reasoning templates render in history);
- `tool_choice` any/tool/none maps to required/named/none, and
  `disable_parallel_tool_use` to `parallel_tool_calls`;
- `thinking` enabled/disabled sets the templates' reasoning switches
  (`enable_thinking` for GLM and Qwen, `thinking` for Kimi K2.5);
- a final assistant turn is a prefill that the model continues;
- `output_config.format` (or the beta's `output_format`) is chat's
  `response_format` of type json_schema.
Images and documents are refused: no model this server loads reads them.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from engine.requests.outputs import RequestOutput
from engine.server.anthropic_protocol import (
    Conversation,
    InputMessage,
    MessagesRequest,
    OtherBlock,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from engine.server.chat_rendering import check_tool_schemas
from engine.server.error_responses import GenerationFailed, bad_request, from_validation_error
from engine.server.protocol import ChatCompletionRequest

# Prepended to a tool result marked `is_error`: chat templates have no field for
# it, and the model should still read that the call failed.
TOOL_ERROR_PREFIX = "Error: "


def _unsupported(block: OtherBlock, param: str):
    if block.type in ("image", "document"):
        return bad_request(
            f"{block.type} content is not supported: the model this server serves reads text only",
            param=param,
        )
    return bad_request(
        f"content blocks of type {block.type!r} are not supported by this server", param=param
    )


def _result_text(block: ToolResultBlock, param: str) -> str:
    content = block.content
    if content is None or isinstance(content, str):
        text = content or ""
    else:
        parts = []
        for number, part in enumerate(content):
            if isinstance(part, OtherBlock):
                raise _unsupported(part, f"{param}.content.{number}")
            if not isinstance(part, TextBlock):
                raise bad_request(
                    f"a tool_result may hold text blocks, not {part.type!r}",
                    param=f"{param}.content.{number}",
                )
            parts.append(part.text)
        text = "\n".join(parts)
    return TOOL_ERROR_PREFIX + text if block.is_error else text


def _user_messages(message: InputMessage, index: int) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": "user", "content": message.content}]
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for number, block in enumerate(message.content):
        param = f"messages.{index}.content.{number}"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            content = _result_text(block, param)
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": content})
        elif isinstance(block, OtherBlock):
            raise _unsupported(block, param)
        else:
            raise bad_request(
                f"{block.type} blocks belong in assistant messages, not user messages", param=param
            )
    if texts or not out:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant_message(message: InputMessage, index: int) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": "assistant", "content": message.content}
    texts, thoughts, calls = [], [], []
    for number, block in enumerate(message.content):
        param = f"messages.{index}.content.{number}"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            thoughts.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # encrypted by another provider: nothing a local model can read
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": arguments},
                }
            )
        elif isinstance(block, OtherBlock):
            raise _unsupported(block, param)
        else:
            raise bad_request(
                "tool_result blocks belong in user messages, not assistant messages", param=param
            )
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thoughts:
        out["reasoning_content"] = "\n".join(thoughts)
    if calls:
        out["tool_calls"] = calls
    return out


def _system_text(system: str | list | None, param: str) -> str | None:
    if system is None or isinstance(system, str):
        return system or None
    parts = []
    for number, block in enumerate(system):
        if not isinstance(block, TextBlock):
            raise bad_request("system blocks must be text blocks", param=f"{param}.{number}")
        parts.append(block.text)
    return "\n".join(parts) or None


def _tools(body: Conversation) -> tuple[list[dict] | None, Any, bool]:
    """(tools, tool_choice, parallel_tool_calls) for the chat request."""
    tools = []
    for number, tool in enumerate(body.tools or []):
        if tool.type not in (None, "custom"):
            raise bad_request(
                f"server tools (type {tool.type!r}) are not supported; define the tool with an "
                "input_schema and run it in the client",
                param=f"tools.{number}.type",
            )
        if tool.input_schema is not None:
            check_tool_schemas([(f"tools.{number}.input_schema", tool.input_schema)])
        function = {"name": tool.name, "parameters": tool.input_schema or {"type": "object"}}
        if tool.description:
            function["description"] = tool.description
        tools.append({"type": "function", "function": function})
    choice = body.tool_choice
    if choice is None:
        return tools or None, None, True
    mapped: Any = {"auto": "auto", "any": "required", "none": "none"}.get(choice.type)
    if choice.type == "tool":
        mapped = {"type": "function", "function": {"name": choice.name}}
    return tools or None, mapped, not choice.disable_parallel_tool_use


def _template_switches(body: Conversation) -> dict[str, Any] | None:
    if body.thinking is None or body.thinking.type == "adaptive":
        return None
    enabled = body.thinking.type == "enabled"
    # Templates ignore variables they do not use, so both switches can be set.
    return {"enable_thinking": enabled, "thinking": enabled}


def chat_fields(body: Conversation) -> dict[str, Any]:
    """The chat request's fields for `body`; 400 for what cannot be served."""
    messages: list[dict[str, Any]] = []
    system = _system_text(body.system, "system")
    if system is not None:
        messages.append({"role": "system", "content": system})
    for index, message in enumerate(body.messages):
        if message.role == "user":
            messages.extend(_user_messages(message, index))
        elif message.role == "system":  # kept in place, as chat keeps a later system message
            text = _system_text(message.content, f"messages.{index}.content")
            messages.append({"role": "system", "content": text or ""})
        else:
            messages.append(_assistant_message(message, index))
    tools, tool_choice, parallel = _tools(body)
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "tools": tools,
        "tool_choice": tool_choice,
        "parallel_tool_calls": parallel,
        "chat_template_kwargs": _template_switches(body),
        "continue_final_message": body.messages[-1].role == "assistant",
    }
    if isinstance(body, MessagesRequest):
        fields["max_tokens"] = body.max_tokens
        fields["temperature"] = body.temperature
        if body.top_p is not None:
            fields["top_p"] = body.top_p
        if body.top_k is not None:
            fields["top_k"] = body.top_k
        fields["stop"] = body.stop_sequences or None
        structured = body.structured_output
        if structured is not None:
            schema = {"name": "output", "schema": structured.json_schema, "strict": True}
            fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    return fields


def to_chat_request(body: Conversation) -> ChatCompletionRequest:
    """The chat request that renders and samples as `body` asks; 400 for what cannot be served.

    Chat's own checks apply too (structured output is served where chat serves
    `response_format`); a refusal names the Messages field, not chat's."""
    try:
        return ChatCompletionRequest.model_validate(chat_fields(body))
    except ValidationError as error:
        message = from_validation_error(error).message.replace("Value error, ", "")
        raise bad_request(message.replace("response_format", "output_config.format")) from error


def stop_reason(
    output: RequestOutput,
    made_tool_calls: bool,
    stop_sequences: list[str] | None,
    context_limited: bool = False,
) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished output; a failed one raises.

    `context_limited`: max_tokens was cut to the room the context had left, so
    running out of tokens means the context was full, which Anthropic names
    `model_context_window_exceeded`.
    """
    completion = output.outputs[0]
    reason = completion.finish_reason
    if reason == "error":
        raise GenerationFailed(output.error or "the engine failed this request")
    if reason == "length":
        return ("model_context_window_exceeded" if context_limited else "max_tokens"), None
    matched = completion.stop_reason
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return ("tool_use" if made_tool_calls else "end_turn"), None


def usage(output: RequestOutput) -> dict[str, int]:
    """Anthropic's usage: `input_tokens` counts only the prompt tokens the cache did not hold,
    so input + cache reads is the whole prompt, as Anthropic bills it. The prefix cache
    fills itself, so nothing is reported as a cache write."""
    cached = output.num_cached_tokens
    return {
        "input_tokens": len(output.prompt_token_ids) - cached,
        "output_tokens": len(output.outputs[0].token_ids),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
