"""Tools for models whose chat template cannot render them.

Templates of tool-trained models (Qwen, GLM, Kimi) take `tools` and render
tool calls and results in the model's own format. Others, like the default
model's plain ChatML template, ignore `tools` entirely, so the model would
never learn what it may call. For those the server writes the tools into the
system message itself, in the Hermes format (`<tool_call>{json}</tool_call>`),
and rewrites tool calls and results in the history into that format's text,
so the conversation reads the same way the model is asked to answer.
"""

from __future__ import annotations

import json
from typing import Any

from engine.chat.tool_text import inline_tools as inline_tool_text
from engine.chat.tool_text import template_renders_tools  # noqa: F401  (used by chat_rendering)

INSTRUCTIONS = """# Tools

You may call one or more functions to help with the user's request. The functions you can call are described in JSON below, between <tools> and </tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object naming it and giving its arguments, between <tool_call> and </tool_call>:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>"""


def tool_instructions(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return INSTRUCTIONS.format(tools=lines)


def inline_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict]:
    """Messages with the tool instructions in the system message and tool traffic as text."""
    return inline_tool_text(messages, tool_instructions(tools) if tools else None)
