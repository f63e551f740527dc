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

INSTRUCTIONS = """# Tools

You may call one or more functions to help with the user's request. The functions you can call are described in JSON below, between <tools> and </tools>:
<tools>
{tools}
</tools>

To call a function, answer with a JSON object naming it and giving its arguments, between <tool_call> and </tool_call>:
<tool_call>
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
</tool_call>"""


def template_renders_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def tool_instructions(tools: list[dict[str, Any]]) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return INSTRUCTIONS.format(tools=lines)


def _call_text(call: dict[str, Any]) -> str:
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # keep what the client sent; the model sees it as written
    body = {"name": function.get("name", ""), "arguments": arguments}
    return f"<tool_call>\n{json.dumps(body, ensure_ascii=False)}\n</tool_call>"


def inline_tools(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict]:
    """Messages with the tool instructions in the system message and tool traffic as text."""
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
        instructions = tool_instructions(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out
