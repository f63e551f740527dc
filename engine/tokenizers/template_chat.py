"""`apply_chat_template` for the engine's own tokenizer classes, as transformers 5 does it.

The tokenizers that do not go through transformers (Kimi's tiktoken one, a fast
tokenizer read back from its snapshot) render their checkpoint's template with
engine.tokenizers.chat_template and offer the same two methods as transformers'
tokenizers: `get_chat_template` picks the template, `apply_chat_template` renders
a conversation with the tokenizer's named special tokens as template variables.
"""

from __future__ import annotations

from typing import Any

from engine.tokenizers.chat_template import render_chat_template


class ChatTemplates:
    """Mixed into a tokenizer class that has `chat_template` (text, a dict of named
    templates, or None), `name_or_path`, `special_tokens_map` and `encode`."""

    chat_template: str | dict[str, str] | None
    name_or_path: str

    def template_tools(self, tools: list) -> list:
        """The tool schemas as the template sees them (a class may reorder them)."""
        return tools

    def get_chat_template(self, chat_template: str | None = None, tools: list | None = None) -> str:
        """The template to render: a named one, the given text, or the checkpoint's default."""
        templates = self.chat_template
        if isinstance(templates, dict):
            if chat_template in templates:
                return templates[chat_template]
            if chat_template is None:
                name = "tool_use" if tools is not None and "tool_use" in templates else "default"
                if name not in templates:
                    raise ValueError(f"no default among the chat templates {sorted(templates)}")
                return templates[name]
        if chat_template is not None:
            return chat_template
        if templates is None:
            raise ValueError(f"{self.name_or_path or 'this tokenizer'} has no chat template")
        return templates

    def apply_chat_template(
        self,
        conversation: list,
        tools: list | None = None,
        documents: list | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs: Any,
    ):
        """The conversation rendered with the checkpoint's template, as text or token ids.

        Returns like transformers 5: text when `tokenize=False`; otherwise a
        BatchEncoding (`input_ids`, `attention_mask`), or the ids alone with
        `return_dict=False`. Other keyword arguments reach the template.
        """
        template = self.get_chat_template(chat_template, tools)
        text = render_chat_template(
            template,
            conversation,
            tools=None if tools is None else self.template_tools(list(tools)),
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **{**self.special_tokens_map, **kwargs},
        )
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        if not return_dict:
            return ids
        from transformers import BatchEncoding

        return BatchEncoding({"input_ids": ids, "attention_mask": [1] * len(ids)})
