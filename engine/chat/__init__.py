"""Turning raw model output into chat messages: reasoning, content, tool calls.

Pure Python, no engine dependencies: the server feeds detokenized text in and
gets OpenAI-shaped events out. See `tool_parsers` for the formats, `reasoning`
for `<think>`, `output` for the two chained, and `events` for what they emit.
"""

from engine.chat.events import (
    ContentDelta,
    ParsedMessage,
    ReasoningDelta,
    StreamEvent,
    ToolCall,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    collect_events,
)
from engine.chat.output import ChatEvent, ChatOutputParser, ParsedChatMessage
from engine.chat.reasoning import (
    ReasoningParser,
    ReasoningResult,
    parse_reasoning,
    prompt_opens_reasoning,
)
from engine.chat.tool_parsers import (
    TOOL_PARSERS,
    ToolParser,
    detect_tool_parser,
    get_tool_parser,
    new_call_id,
)

__all__ = [
    "TOOL_PARSERS",
    "ChatEvent",
    "ChatOutputParser",
    "ContentDelta",
    "ParsedChatMessage",
    "ParsedMessage",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningResult",
    "StreamEvent",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallEnd",
    "ToolCallError",
    "ToolParser",
    "collect_events",
    "detect_tool_parser",
    "get_tool_parser",
    "new_call_id",
    "parse_reasoning",
    "prompt_opens_reasoning",
]
