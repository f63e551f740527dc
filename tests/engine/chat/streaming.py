"""Helpers that feed a text to a streaming parser in every way it could arrive."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator

from engine.chat import (
    ContentDelta,
    ParsedMessage,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallError,
    collect_events,
)
from engine.chat.tool_parsers import ToolParser


def counting_ids() -> Callable[[], str]:
    """Deterministic call ids, so two runs over the same text can be compared."""
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def two_piece_splits(text: str) -> Iterator[list[str]]:
    for cut in range(len(text) + 1):
        yield [text[:cut], text[cut:]]


def random_chunkings(text: str, count: int = 15, seed: int = 0) -> Iterator[list[str]]:
    if len(text) < 2:
        yield [text]
        return
    rng = random.Random(seed)
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        bounds = [0, *cuts, len(text)]
        yield [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def every_chunking(text: str) -> Iterator[list[str]]:
    """All 2-piece splits, one character at a time, and some random chunkings."""
    yield from two_piece_splits(text)
    yield list(text)
    yield from random_chunkings(text)


def run_stream(parser: ToolParser, chunks: list[str]) -> list:
    events = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    return events


def check_event_shape(events: list) -> None:
    """The OpenAI streaming contract: per call, a header delta first, then argument deltas."""
    announced: list[int] = []
    closed: set[int] = set()
    arguments: dict[int, str] = {}
    for event in events:
        if isinstance(event, ContentDelta):
            assert event.text, "empty content delta"
        elif isinstance(event, ToolCallDelta):
            assert event.index not in closed, f"delta after call {event.index} ended"
            if event.index not in announced:
                assert event.id and event.name, "a call's first delta carries id and name"
                assert event.arguments == ""
                assert event.index == len(announced), "indices count up from 0"
                announced.append(event.index)
                arguments[event.index] = ""
            else:
                assert event.id is None and event.name is None
                assert event.arguments
                arguments[event.index] += event.arguments
        elif isinstance(event, ToolCallEnd):
            assert event.index in announced and event.index not in closed
            closed.add(event.index)
            assert isinstance(json.loads(arguments[event.index]), dict)
        elif isinstance(event, ToolCallError):
            if event.index is not None:
                assert event.index in announced and event.index not in closed
                closed.add(event.index)
        else:
            raise AssertionError(f"unexpected event {event!r}")
    assert closed == set(announced), "every announced call ends or is voided"


def assert_streams_like_complete(make_parser: Callable[[], ToolParser], text: str) -> ParsedMessage:
    """However the text is split, the streamed events fold into the complete parse."""
    complete = make_parser().parse_complete(text)
    for chunks in every_chunking(text):
        events = run_stream(make_parser(), chunks)
        check_event_shape(events)
        streamed = collect_events(events)
        assert streamed == complete, f"chunks={chunks!r}"
    return complete


def call_summary(message: ParsedMessage) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments_json)) for call in message.tool_calls]
