"""ChatRenderer: messages, tools and options in; prompt text, token ids and how to read the answer out.

The one place a chat becomes a prompt. The server's chat APIs
(engine.server.chat_rendering), the agent's in-process client and `LLM.chat`
all render here, so one conversation gives the same bytes and the same
parser everywhere. The rules:

- Tools in the model's own format when its template renders `tools` and the
  engine has a parser for that format (chosen from config.json's model_type
  and the template, `detect_tool_parser`). Otherwise the tools are written
  into the system message as text (rendering.text_tools) and the Hermes
  parser reads the answer: a template that renders tools in a format no
  parser reads would give calls nobody can pick up.
- `<think>` reasoning is split off the answer when the template closes it
  (`</think>`), and the answer starts inside reasoning when the prompt leaves
  a `<think>` open.
- When a parser's markers are special tokens (Kimi's `<|tool_call_begin|>`),
  special tokens must stay in the detokenized text for the parser to see
  them; every other special token is then removed from that text, so that
  e.g. a ChatML `<|im_end|>` never shows up as content.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

from engine.chat import (
    ChatOutputParser,
    ParsedChatMessage,
    ReasoningParser,
    detect_tool_parser,
    get_tool_parser,
    prompt_opens_reasoning,
)
from engine.chat.reasoning import THINK_CLOSE, THINK_OPEN
from engine.chat.tool_text import (
    PARSER_MARKERS,
    inline_tools,
    read_model_type,
    template_renders_tools,
)
from engine.rendering.messages import ChatRenderError, template_messages, template_tools
from engine.rendering.text_tools import TEXT_TOOL_PARSER, tool_instructions

# Keyword arguments of apply_chat_template that template options may not override.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "tokenize",
        "add_generation_prompt",
        "continue_final_message",
        "return_dict",
        "chat_template",
    }
)
# What a template may raise on messages it cannot render (raise_exception, a
# missing key, a wrong type); anything else is a bug worth its traceback.
_TEMPLATE_FAILURES = (TemplateError, ValueError, TypeError, KeyError, IndexError, AttributeError)


class NoChatTemplateError(ChatRenderError):
    """The model has no chat template, so chats cannot be rendered for it."""


@dataclass(frozen=True)
class RenderedChat:
    text: str
    token_ids: list[int]
    tools: list[dict[str, Any]] = field(default_factory=list)  # what the parser may see called
    tool_parser: str | None = None  # None: tool calls are not parsed
    reasoning: bool = False
    starts_in_reasoning: bool = False
    skip_special_tokens: bool = True  # what detokenizing the answer must do
    strip_texts: tuple[str, ...] = ()  # special tokens removed from kept-special output

    def output_parser(self) -> ChatOutputParser:
        """A fresh parser for one answer.

        Calls stream as the model writes them: the call is announced once its
        name is known and its arguments follow as far as they stay a valid JSON
        prefix, so a client sees a long `write_file` grow instead of waiting
        for all of it. A stream cannot retract what it sent: a call found
        malformed after it was announced ends where its valid prefix ended,
        never counts as a call (finish_reason stays "stop") and its text
        follows as content, as in the complete answer. Constrained decoding
        (tool_choice required or named) makes such calls impossible.
        """
        tool_parser = None
        if self.tool_parser is not None:
            tool_parser = get_tool_parser(self.tool_parser)(self.tools)
        reasoning = ReasoningParser(self.starts_in_reasoning) if self.reasoning else None
        return ChatOutputParser(tool_parser, reasoning)

    def clean(self, text: str) -> str:
        for special in self.strip_texts:
            text = text.replace(special, "")
        return text

    def parse(self, text: str) -> ParsedChatMessage:
        """A whole answer (detokenized as `skip_special_tokens` says) read into a message."""
        return self.output_parser().parse_complete(self.clean(text))


def default_template(tokenizer: Any) -> str | None:
    """The default chat template as text (tokenizers may hold a dict of named templates)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("default") or next(iter(template.values()), None)
    return template


def _special_texts(tokenizer: Any) -> frozenset[str]:
    texts = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(token, "special", False):
            texts.add(str(getattr(token, "content", token)))
    return frozenset(text for text in texts if text)


class ChatRenderer:
    """Renders chats for one model: its tokenizer, chat template and model_type."""

    def __init__(
        self, tokenizer: Any, model_type: str | None = None, chat_template: str | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.model_type = model_type
        self.template = chat_template or default_template(tokenizer) or ""
        if not self.template:
            raise NoChatTemplateError("the model has no chat template")
        renders_tools = template_renders_tools(self.template)
        self.native_parser = (
            detect_tool_parser(model_type, self.template) if renders_tools else None
        )
        self.reasoning = THINK_CLOSE in self.template
        self.specials = _special_texts(tokenizer)

    @classmethod
    def for_model_dir(cls, tokenizer: Any, model_dir: str | Path | None) -> ChatRenderer:
        """The renderer for a loaded checkpoint (model_type from its config.json)."""
        return cls(tokenizer, read_model_type(Path(model_dir)) if model_dir else None)

    def tool_parser(self, tools: list[dict[str, Any]]) -> str | None:
        """The parser that reads answers to a prompt offering `tools`."""
        if not tools:
            return None
        return self.native_parser or TEXT_TOOL_PARSER

    def render_text(
        self,
        messages: Iterable[Mapping[str, Any]],
        tools: Iterable[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text alone (e.g. for a prefix of the conversation)."""
        return self._render(
            template_messages(messages),
            template_tools(tools),
            add_generation_prompt,
            continue_final_message,
            template_kwargs,
        )

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        add_generation_prompt: bool,
        continue_final_message: bool,
        template_kwargs: Mapping[str, Any] | None,
    ) -> str:
        native = self.native_parser is not None
        if not native:
            messages = inline_tools(messages, tool_instructions(tools))
        options = {
            key: value
            for key, value in (template_kwargs or {}).items()
            if key not in RESERVED_TEMPLATE_KWARGS
        }
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                chat_template=self.template,
                tools=(tools or None) if native else None,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message,
                tokenize=False,
                **options,
            )
        except _TEMPLATE_FAILURES as error:
            raise ChatRenderError(
                f"the chat template could not render these messages: {error}"
            ) from error

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(
        self,
        messages: Iterable[Mapping[str, Any]],
        tools: Iterable[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: Mapping[str, Any] | None = None,
        skip_special_tokens: bool | None = None,
    ) -> RenderedChat:
        """The prompt and how to read its answer. `skip_special_tokens` None: decided
        here (kept when the parser needs them); a bool overrides it, as a request may."""
        tools = template_tools(tools)
        text = self._render(
            template_messages(messages),
            tools,
            add_generation_prompt,
            continue_final_message,
            template_kwargs,
        )
        parser = self.tool_parser(tools)
        markers = set(PARSER_MARKERS.get(parser, ())) if parser else set()
        if self.reasoning:
            markers |= {THINK_OPEN, THINK_CLOSE}
        keep_specials = bool(markers & self.specials)
        if skip_special_tokens is not None:
            keep_specials = not skip_special_tokens
        return RenderedChat(
            text=text,
            token_ids=self.encode(text),
            tools=tools,
            tool_parser=parser,
            reasoning=self.reasoning,
            starts_in_reasoning=self.reasoning and prompt_opens_reasoning(text),
            skip_special_tokens=not keep_specials,
            strip_texts=tuple(sorted(self.specials - markers, key=len, reverse=True))
            if keep_specials
            else (),
        )
