"""Chats into prompts, one way for every caller (server, agent client, LLM.chat).

`ChatRenderer(tokenizer, model_type)` renders messages and tools with the
model's chat template into a `RenderedChat`: the prompt text and token ids,
the tool-call parser and reasoning split that read the answer, and how the
answer must be detokenized for them. See renderer.py for the rules.
"""

from engine.rendering.messages import ChatRenderError, template_messages, template_tools
from engine.rendering.renderer import (
    ChatRenderer,
    NoChatTemplateError,
    RenderedChat,
    default_template,
)
from engine.rendering.text_tools import tool_instructions

__all__ = [
    "ChatRenderError",
    "ChatRenderer",
    "NoChatTemplateError",
    "RenderedChat",
    "default_template",
    "template_messages",
    "template_tools",
    "tool_instructions",
]
