"""Tools for models whose chat template cannot render them.

Templates of tool-trained models (Qwen, GLM, Kimi) take `tools` and render
tool calls and results in the model's own format. Others, like the default
model's plain ChatML template, ignore `tools`, so the model would never learn
what it may call. For those the tools are written into the system message in
the Hermes format (`<tool_call>{json}</tool_call>`), and earlier calls and
results are rewritten as that format's text (engine.chat.tool_text), so the
conversation reads the way the model is asked to answer.
"""

from __future__ import annotations

import json
from typing import Any

INSTRUCTIONS = """# Tools

You may call one or more functions to help with the user's request. The functions you can call are described in JSON below, between <tools> and </tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object naming it and giving its arguments, between <tool_call> and </tool_call>:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>

The result of each call comes back between <tool_response> and </tool_response>."""

# The parser that reads answers written to these instructions.
TEXT_TOOL_PARSER = "hermes"


def tool_instructions(tools: list[dict[str, Any]]) -> str | None:
    """The instructions with one JSON line per tool; None without tools."""
    if not tools:
        return None
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return INSTRUCTIONS.format(tools=lines)
