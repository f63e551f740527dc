"""Builders the e2e tests share: tokenizers with chat templates, served models, clients."""

from __future__ import annotations

from pathlib import Path

from engine.model_files.store import default_model_dir, is_complete
from engine.server.served_model import ServedModel
from tests.engine.checkpoints import save_tokenizer

API_KEY = "test-key-123"

# A Hermes-style template (as Qwen2.5 renders tools), reduced to what the tests need.
HERMES_TEMPLATE = """
{%- if tools %}<|im_start|>system
{{ messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.' }}
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m['role'] == 'system' %}
{%- elif m['role'] == 'tool' %}<|im_start|>user
<tool_response>
{{ m['content'] }}
</tool_response><|im_end|>
{% elif m['role'] == 'assistant' and m.get('tool_calls') %}<|im_start|>assistant
{{ m['content'] }}
{%- for tc in m['tool_calls'] %}<tool_call>
{"name": "{{ tc['function']['name'] }}", "arguments": {{ tc['function']['arguments'] | tojson }}}
</tool_call>{%- endfor %}<|im_end|>
{% else %}<|im_start|>{{ m['role'] }}
{{ m['content'] }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

# The same with a thinking model's habit of opening <think> in the generation prompt.
THINKING_TEMPLATE = (
    HERMES_TEMPLATE.replace(
        "{%- if add_generation_prompt %}<|im_start|>assistant\n",
        "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n",
    )
    + "{# a model that reasons in <think>...</think> #}"
)


def default_model_present() -> bool:
    return is_complete(default_model_dir())


def hermes_tokenizer(directory: Path, special_markers: bool = True):
    """A tiny byte-level tokenizer whose template renders tools; `<tool_call>` is a special token."""
    tokenizer = save_tokenizer(directory, vocab_size=320)
    if special_markers:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<tool_call>", "</tool_call>"]})
    tokenizer.chat_template = HERMES_TEMPLATE
    return tokenizer


def served(tokenizer, template: str | None = None, model_type: str = "qwen2") -> ServedModel:
    return ServedModel(
        names=["scripted-model", "scripted"],
        tokenizer=tokenizer,
        max_context_tokens=512,
        capacity_tokens=4096,
        model_type=model_type,
        chat_template=template if template is not None else tokenizer.chat_template,
    )


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web.search-v2",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
