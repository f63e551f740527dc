"""Random mixes of markers and text: no parser may raise, and every split agrees.

Real models emit truncated, repeated and interleaved markup; whatever comes,
the parser must report it, not crash, and streaming must match the complete
parse.
"""

from __future__ import annotations

import json
import random

import pytest

from engine.chat import (
    ChatOutputParser,
    ReasoningDelta,
    ReasoningParser,
    collect_events,
    parse_reasoning,
)
from engine.chat.tool_parsers import TOOL_PARSERS
from tests.engine.chat.streaming import (
    check_event_shape,
    counting_ids,
    random_chunkings,
    run_stream,
)

VALUES = ["1", "x y", '{"a": [1, "<b>"]}', "", "true", 'say "hi"\n']


def kimi_call(rng: random.Random, index: int) -> str:
    value = json.dumps({rng.choice(["k", "v"]): rng.choice(VALUES)})
    # Headers as Kimi writes them, and as a client's rewritten ids teach it to.
    header = rng.choice(["functions.f", "functions.a.b-c", "call", ""])
    header = f"{header}:{index}" if header.startswith("functions") else f"{header}{index}"
    return f"<|tool_call_begin|>{header}<|tool_call_argument_begin|>{value}<|tool_call_end|>"


def glm_call(rng: random.Random, index: int) -> str:
    sep = rng.choice(["", "\n", " "])
    pairs = "".join(
        f"<arg_key>{key}</arg_key>{sep}<arg_value>{rng.choice(VALUES)}</arg_value>{sep}"
        for key in rng.sample(["k", "v", "w"], rng.randint(0, 3))
    )
    return f"<tool_call>f{sep}{pairs}</tool_call>"


def hermes_call(rng: random.Random, index: int) -> str:
    body = json.dumps({"name": "f", "arguments": {"k": rng.choice(VALUES)}})
    return f"<tool_call>\n{body}\n</tool_call>"


def kimi_message(rng: random.Random) -> str:
    calls = "".join(kimi_call(rng, i) for i in range(rng.randint(1, 3)))
    if rng.random() < 0.2:
        return calls  # Kimi occasionally leaves out the section markers
    return f"<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"


MESSAGES = {
    "kimi_k2": kimi_message,
    "glm45": lambda rng: "".join(glm_call(rng, i) for i in range(rng.randint(1, 3))),
    "hermes": lambda rng: "\n".join(hermes_call(rng, i) for i in range(rng.randint(1, 3))),
}
MESSAGES["glm47"] = MESSAGES["glm45"]

TOOLS = [
    {
        "type": "function",
        "function": {"name": "f", "parameters": {"properties": {"v": {"type": "integer"}}}},
    },
    {"type": "function", "function": {"name": "g", "parameters": {"properties": {"k": {}}}}},
]


def random_text(rng: random.Random, name: str) -> str:
    """A well-formed message with text around it, then maybe damaged."""
    text = rng.choice(["", "Sure. ", "a<b "]) + MESSAGES[name](rng) + rng.choice(["", " ok", "\n"])
    for _ in range(rng.choice([0, 0, 1, 2])):
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        damage = rng.choice(["cut", "drop", "repeat"])
        if damage == "cut":
            text = text[:a]
        elif damage == "drop":
            text = text[:a] + text[b:]
        else:
            text = text[:b] + text[a:]
    return text


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_random_markup_never_raises_and_streams_like_complete(name):
    rng = random.Random(name)
    cls = TOOL_PARSERS[name]
    for _ in range(100):
        text = random_text(rng, name)
        complete = cls(TOOLS, make_call_id=counting_ids()).parse_complete(text)
        for chunks in [list(text), *random_chunkings(text, count=3, seed=rng.random())]:
            for hold in (False, True):
                parser = cls(TOOLS, hold_until_complete=hold, make_call_id=counting_ids())
                events = run_stream(parser, chunks)
                check_event_shape(events)
                assert collect_events(events) == complete, (text, chunks, hold)


def test_random_reasoning_text_streams_like_complete():
    rng = random.Random(7)
    pieces = ["<think>", "</think>", "<th", "</", "ink>", "a", " ", "\n"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 10)))
        for starts in (False, True):
            expected = parse_reasoning(text, starts)
            parser = ReasoningParser(starts)
            events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
            reasoning = "".join(e.text for e in events if type(e).__name__ == "ReasoningDelta")
            content = "".join(e.text for e in events if type(e).__name__ == "ContentDelta")
            assert (reasoning or None, content) == (expected.reasoning_content, expected.content)


def think_text(rng: random.Random, name: str) -> str:
    """Calls with thinking around them, opened, closed, or left open by a call."""
    pieces = ["<think>", "</think>", "plan ", "\n", MESSAGES[name](rng), "answer"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))


def chained(name: str, starts_in_reasoning: bool, hold: bool) -> ChatOutputParser:
    tool_parser = TOOL_PARSERS[name](TOOLS, hold_until_complete=hold, make_call_id=counting_ids())
    return ChatOutputParser(tool_parser, ReasoningParser(starts_in_reasoning))


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
def test_random_thinking_with_calls_streams_like_complete(name):
    rng = random.Random("think-" + name)
    for _ in range(60):
        text = think_text(rng, name)
        starts = rng.random() < 0.3
        complete = chained(name, starts, hold=False).parse_complete(text)
        for chunks in [list(text), *random_chunkings(text, count=2, seed=rng.random())]:
            for hold in (False, True):
                parser = chained(name, starts, hold)
                events = [e for c in chunks for e in parser.feed(c)] + parser.finish()
                check_event_shape([e for e in events if not isinstance(e, ReasoningDelta)])
                reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
                message = collect_events(e for e in events if not isinstance(e, ReasoningDelta))
                assert (reasoning or None) == complete.reasoning_content, (text, chunks)
                assert message.content == complete.content, (text, chunks, hold)
                assert message.tool_calls == complete.tool_calls, (text, chunks, hold)
                assert message.errors == complete.errors, (text, chunks, hold)
