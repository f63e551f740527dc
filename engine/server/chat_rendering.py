"""A chat request made into a prompt, plus how its output is to be read.

Rendering goes through the tokenizer's chat template with `tools` (see
tool_prompt for templates that cannot render tools). The same place decides
how the output is parsed: which tool-call parser (by config.json's
model_type and the template, `detect_tool_parser`), whether `<think>`
reasoning is split off, and whether special tokens must be kept in the
detokenized text because the parser's markers are special tokens (Kimi's
`<|tool_call_begin|>`); when kept, every other special token is removed from
the text so that e.g. a ChatML `<|im_start|>` never leaks into content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from engine.chat import (
    ChatOutputParser,
    ReasoningParser,
    detect_tool_parser,
    get_tool_parser,
    prompt_opens_reasoning,
)
from engine.chat.reasoning import THINK_CLOSE, THINK_OPEN
from engine.chat.tool_text import PARSER_MARKERS
from engine.server.errors import bad_request
from engine.server.protocol import ChatCompletionRequest, ChatMessage, NamedToolChoice
from engine.server.served_model import ServedModel
from engine.server.tool_prompt import inline_tools, template_renders_tools

# Keyword arguments of apply_chat_template that a request may not override.
_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "chat_template",
    }
)


@dataclass
class ChatPrompt:
    text: str
    token_ids: list[int]
    tools: list[dict[str, Any]] = field(default_factory=list)  # what the parser may see called
    tool_parser: str | None = None  # None: tool calls are not parsed
    reasoning: bool = False
    starts_in_reasoning: bool = False
    skip_special_tokens: bool = True
    strip_texts: tuple[str, ...] = ()  # special tokens removed from kept-special output

    def output_parser(self, streaming: bool) -> ChatOutputParser:
        """A fresh parser for one choice. Streaming holds each call until it is complete,
        so a malformed call is never announced (OpenAI streams cannot retract one)."""
        tool_parser = None
        if self.tool_parser is not None:
            tool_parser = get_tool_parser(self.tool_parser)(
                self.tools, hold_until_complete=streaming
            )
        reasoning = ReasoningParser(self.starts_in_reasoning) if self.reasoning else None
        return ChatOutputParser(tool_parser, reasoning)

    def clean(self, text: str) -> str:
        for special in self.strip_texts:
            text = text.replace(special, "")
        return text


def _flatten_content(message: ChatMessage, index: int) -> str | None:
    content = message.content
    if content is None or isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise bad_request(
                f"content part of type {part.get('type')!r} is not supported (text only)",
                param=f"messages.{index}.content",
            )
        parts.append(part["text"])
    return "".join(parts)


def _template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    data = message.model_dump(exclude_none=True)
    data["role"] = "system" if message.role == "developer" else message.role
    # String-concatenating templates (ChatML) fail on None; "" reads the same to the rest.
    data["content"] = _flatten_content(message, index) or ""
    calls = []
    for call in message.tool_calls or []:
        call = dict(call)
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            # Templates (Qwen, GLM, Kimi) iterate or tojson the arguments: give them the object.
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
                function["arguments"] = parsed if isinstance(parsed, dict) else arguments
            except ValueError:
                pass
        call["function"] = function
        calls.append(call)
    if calls:
        data["tool_calls"] = calls
    return data


def _active_tools(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    choice = request.tool_choice
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    if choice == "none":
        return []
    if not tools:
        if choice == "required" or isinstance(choice, NamedToolChoice):
            raise bad_request("tool_choice asks for a tool call but no tools were given", "tools")
        return []
    if isinstance(choice, NamedToolChoice):
        named = [tool for tool in tools if tool["function"]["name"] == choice.function.name]
        if not named:
            raise bad_request(
                f"tool_choice names {choice.function.name!r}, which is not among the tools",
                param="tool_choice",
            )
        return named  # only the named tool is offered, which is the most we can enforce
    return tools


def _special_texts(tokenizer: Any) -> set[str]:
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(token.content) if hasattr(token, "content") else str(token))
    return {text for text in texts if text}


def render_chat(request: ChatCompletionRequest, model: ServedModel) -> ChatPrompt:
    tokenizer = model.tokenizer
    template = model.chat_template
    if not template:
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    tools = _active_tools(request)
    messages = [_template_message(m, i) for i, m in enumerate(request.messages)]
    renders_tools = template_renders_tools(template)
    if renders_tools:
        parser = detect_tool_parser(model.model_type, template) if tools else None
    else:
        messages = inline_tools(messages, tools)
        parser = "hermes" if tools else None
    extra = {
        key: value
        for key, value in (request.chat_template_kwargs or {}).items()
        if key not in _RESERVED_TEMPLATE_KWARGS
    }
    try:
        text = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tools=(tools or None) if renders_tools else None,
            add_generation_prompt=not request.continue_final_message,
            continue_final_message=request.continue_final_message,
            tokenize=False,
            **extra,
        )
    except (TemplateError, ValueError, TypeError, KeyError) as error:
        raise bad_request(f"the chat template could not render these messages: {error}") from error
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    reasoning = THINK_CLOSE in template
    markers = set(PARSER_MARKERS.get(parser, ())) if parser else set()
    if reasoning:
        markers |= {THINK_OPEN, THINK_CLOSE}
    specials = _special_texts(tokenizer)
    keep_specials = bool(markers & specials)
    if request.skip_special_tokens is not None:
        keep_specials = not request.skip_special_tokens
    return ChatPrompt(
        text=text,
        token_ids=token_ids,
        tools=tools,
        tool_parser=parser,
        reasoning=reasoning,
        starts_in_reasoning=reasoning and prompt_opens_reasoning(text),
        skip_special_tokens=not keep_specials,
        strip_texts=tuple(sorted(specials - markers, key=len, reverse=True))
        if keep_specials
        else (),
    )
