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
from pathlib import Path
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
from engine.chat.tool_parsers import glm, hermes, kimi_k2

PARSER_MARKERS: dict[str, tuple[str, ...]] = {
    "hermes": (hermes.CALL_OPEN, hermes.CALL_CLOSE),
    "glm45": glm.ALL_TAGS,
    "glm47": glm.ALL_TAGS,
    "kimi_k2": (
        *kimi_k2.SECTION_BEGINS,
        *kimi_k2.SECTION_ENDS,
        kimi_k2.CALL_BEGIN,
        kimi_k2.ARGUMENT_BEGIN,
        kimi_k2.CALL_END,
    ),
}


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


def read_model_type(model_dir: Path) -> str | None:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text_config = config.get("text_config")
    if isinstance(text_config, dict) and text_config.get("model_type"):
        return text_config["model_type"]
    return config.get("model_type")


def template_renders_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in (chat_template or "")


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


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    body = {"name": function.get("name", ""), "arguments": arguments}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def inline_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict]:
    """Messages with the text tool-call instructions in the system message and tool
    traffic written as that text, for templates that know nothing of tools."""
    out: list[dict[str, Any]] = []
    for message in messages:
        message = dict(message)
        if message["role"] == "assistant" and message.get("tool_calls"):
            calls = "\n".join(_call_text(call) for call in message.pop("tool_calls"))
            content = message.get("content") or ""
            message["content"] = f"{content}\n{calls}" if content else calls
        elif message["role"] == "tool":
            result = message.get("content") or ""
            message = {"role": "user", "content": f"<tool_response>\n{result}\n</tool_response>"}
        out.append(message)
    if tools:
        lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
        instructions = prompts.load("text_tool_calls", tools=lines).rstrip("\n")
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


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
            messages = inline_tools(messages, tools)
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
