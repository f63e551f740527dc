"""Table-driven parser cases: one expected message, checked complete and streamed.

Each case is a model output and the message it must become (reasoning,
content, calls, errors). `run_case` parses it whole, checks that, then feeds
it one character at a time and in seeded random pieces, with calls streamed
incrementally and held until complete, and requires every run to fold into
exactly the complete result with a well-formed event stream.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.chat import ChatOutputParser, ReasoningDelta, ReasoningParser, collect_events
from engine.chat.tool_parsers import ToolParser
from tests.engine.chat.streaming import check_event_shape, counting_ids, random_chunkings


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    content: str = ""
    reasoning: str | None = None
    errors: tuple[str, ...] = ()  # one fragment per expected error message, in order
    tools: tuple[dict[str, Any], ...] | None = None
    thinking: bool = False  # chain a reasoning parser in front
    starts_in_reasoning: bool = False
    ids: tuple[str, ...] | None = None
    arguments_json: tuple[str, ...] | None = None  # exact argument text, where it matters


def tool(name: str, properties: dict[str, Any] | None = None, required=()) -> dict[str, Any]:
    parameters: dict[str, Any] = {"type": "object", "properties": properties or {}}
    if required:
        parameters["required"] = list(required)
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _parser(cls: type[ToolParser], case: Case, hold: bool) -> ChatOutputParser:
    tools = list(case.tools) if case.tools is not None else None
    tool_parser = cls(tools, hold_until_complete=hold, make_call_id=counting_ids())
    reasoning = ReasoningParser(case.starts_in_reasoning) if case.thinking else None
    return ChatOutputParser(tool_parser, reasoning)


def _stream(parser: ChatOutputParser, chunks: list[str]):
    events = [event for chunk in chunks for event in parser.feed(chunk)] + parser.finish()
    assert all(e.text for e in events if isinstance(e, ReasoningDelta)), "empty reasoning delta"
    check_event_shape([e for e in events if not isinstance(e, ReasoningDelta)])
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta)) or None
    return reasoning, collect_events(e for e in events if not isinstance(e, ReasoningDelta))


def run_case(cls: type[ToolParser], case: Case, chunkings: int = 6) -> None:
    complete = _parser(cls, case, hold=False).parse_complete(case.text)
    summary = [(c.name, json.loads(c.arguments_json)) for c in complete.tool_calls]
    assert summary == list(case.calls)
    assert complete.content == case.content
    assert complete.reasoning_content == case.reasoning
    assert len(complete.errors) == len(case.errors), complete.errors
    for message, fragment in zip(complete.errors, case.errors, strict=True):
        assert fragment in message, (fragment, message)
    if case.ids is not None:
        assert tuple(c.id for c in complete.tool_calls) == case.ids
    if case.arguments_json is not None:
        assert tuple(c.arguments_json for c in complete.tool_calls) == case.arguments_json

    splits = [list(case.text), *random_chunkings(case.text, count=chunkings, seed=case.id)]
    for hold in (False, True):
        for chunks in splits:
            reasoning, message = _stream(_parser(cls, case, hold), chunks)
            assert reasoning == complete.reasoning_content, (hold, chunks)
            assert message.content == complete.content, (hold, chunks)
            assert message.tool_calls == complete.tool_calls, (hold, chunks)
            assert message.errors == complete.errors, (hold, chunks)
