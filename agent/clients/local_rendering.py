"""How the local client turns messages and tools into a prompt, and how it reads the answer.

Templates of tool-trained models (Kimi, GLM, Qwen) render `tools` and tool
traffic in the model's native format, which the engine's parser for that
format reads back. Templates that cannot render tools (the default SmolLM2's
plain ChatML) get the text tool-call format of prompts/text_tool_calls.md
written into the system message, with earlier calls and results rewritten
as that text, and the Hermes parser reads `<tool_call>{json}</tool_call>`.

When a parser's markers are special tokens (Kimi's `<|tool_call_begin|>`),
special tokens must stay in the detokenized text for the parser to see; every
other special token is then removed so that e.g. `<|im_end|>` never shows up
as content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import prompts
from engine.chat import (
    ChatOutputParser,
    ReasoningParser,
    detect_tool_parser,
    get_tool_parser,
    prompt_opens_reasoning,
)
from engine.chat.reasoning import THINK_CLOSE, THINK_OPEN
from engine.chat.tool_text import (  # noqa: F401  (read_model_type is re-exported)
    PARSER_MARKERS,
    inline_tools,
    read_model_type,
    template_renders_tools,
)


@dataclass
class RenderedPrompt:
    text: str
    token_ids: list[int]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_parser: str | None = None
    reasoning: bool = False
    starts_in_reasoning: bool = False
    skip_special_tokens: bool = True
    strip_texts: tuple[str, ...] = ()

    def output_parser(self) -> ChatOutputParser:
        # Calls are held until complete, so a malformed one is never half-announced.
        tool_parser = None
        if self.tool_parser is not None:
            tool_parser = get_tool_parser(self.tool_parser)(self.tools, hold_until_complete=True)
        reasoning = ReasoningParser(self.starts_in_reasoning) if self.reasoning else None
        return ChatOutputParser(tool_parser, reasoning)

    def clean(self, text: str) -> str:
        for special in self.strip_texts:
            text = text.replace(special, "")
        return text


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    data = dict(message)
    data["content"] = data.get("content") or ""  # ChatML concatenation fails on None
    calls = []
    for call in data.get("tool_calls") or []:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            # Native templates iterate or tojson the arguments: give them the object.
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
                function["arguments"] = parsed if isinstance(parsed, dict) else arguments
            except ValueError:
                pass
        calls.append({**call, "function": function})
    if calls:
        data["tool_calls"] = calls
    else:
        data.pop("tool_calls", None)
    return data


def _text_tool_instructions(tools: list[dict[str, Any]]) -> str | None:
    """prompts/text_tool_calls.md with the tools listed, for templates without tools."""
    if not tools:
        return None
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return prompts.load("text_tool_calls", tools=lines).rstrip("\n")


def _special_texts(tokenizer: Any) -> set[str]:
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(getattr(token, "content", token)))
    return {text for text in texts if text}


class PromptRenderer:
    """Renders chat requests for one model (its tokenizer, template and model_type)."""

    def __init__(self, tokenizer: Any, model_type: str | None) -> None:
        self.tokenizer = tokenizer
        self.template = getattr(tokenizer, "chat_template", None) or ""
        if not self.template:
            raise ValueError("the model has no chat template, so it cannot run the agent")
        self.native_tools = template_renders_tools(self.template)
        self.native_parser = detect_tool_parser(model_type, self.template)
        self.specials = _special_texts(tokenizer)

    def render_text(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        add_generation_prompt: bool = True,
    ) -> tuple[str, str | None]:
        """The prompt text and the tool parser that reads the answer."""
        messages = [_template_message(m) for m in messages]
        native = self.native_tools and self.native_parser is not None
        if not native:
            messages = inline_tools(messages, _text_tool_instructions(tools))
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=(tools or None) if native else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        parser = (self.native_parser if native else "hermes") if tools else None
        return text, parser

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> RenderedPrompt:
        text, parser = self.render_text(messages, tools)
        reasoning = THINK_CLOSE in self.template
        markers = set(PARSER_MARKERS.get(parser, ())) if parser else set()
        if reasoning:
            markers |= {THINK_OPEN, THINK_CLOSE}
        keep_specials = bool(markers & self.specials)
        return RenderedPrompt(
            text=text,
            token_ids=self.encode(text),
            tools=tools,
            tool_parser=parser,
            reasoning=reasoning,
            starts_in_reasoning=reasoning and prompt_opens_reasoning(text),
            skip_special_tokens=not keep_specials,
            strip_texts=tuple(sorted(self.specials - markers, key=len, reverse=True))
            if keep_specials
            else (),
        )
