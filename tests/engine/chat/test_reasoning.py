"""<think> reasoning split from content, however the text is chunked."""

from __future__ import annotations

import itertools

import pytest

from engine.chat import ContentDelta, ReasoningDelta, ReasoningParser, parse_reasoning
from engine.chat.reasoning import ReasoningResult, prompt_opens_reasoning
from tests.engine.chat.streaming import every_chunking


def stream(chunks: list[str], starts_in_reasoning: bool = False) -> ReasoningResult:
    parser = ReasoningParser(starts_in_reasoning)
    events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
    assert all(isinstance(e, ReasoningDelta | ContentDelta) and e.text for e in events)
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return ReasoningResult(reasoning or None, content)


CASES = [
    # (output, starts_in_reasoning, reasoning_content, content)
    (
        "<think>\nThe user wants 2+2.\n</think>\n\nIt is 4.",
        False,
        "The user wants 2+2.",
        "It is 4.",
    ),
    ("  <think>a</think>b", False, "a", "b"),
    ("Plain answer, no thinking.", False, None, "Plain answer, no thinking."),
    ("\n  indented answer", False, None, "\n  indented answer"),
    ("<think>cut off mid-thought", False, "cut off mid-thought", ""),
    ("<think></think>Answer", False, None, "Answer"),
    ("The tag <think> here is prose.", False, None, "The tag <think> here is prose."),
    ("x</think>y", False, None, "x</think>y"),
    (
        "continuing thought</think>answer <think>x</think>",
        True,
        "continuing thought",
        "answer <think>x</think>",
    ),
    ("<think>repeated open</think>ok", True, "repeated open", "ok"),
    ("all reasoning, never closed", True, "all reasoning, never closed", ""),
    ("</think>direct answer", True, None, "direct answer"),
    ("<thi", False, None, "<thi"),
    ("<think>a</thi", False, "a</thi", ""),
    ("<think>a < b </ c</think>", False, "a < b </ c", ""),
    ("", False, None, ""),
    ("", True, None, ""),
]


@pytest.mark.parametrize(("text", "starts_in_reasoning", "reasoning", "content"), CASES)
def test_split_at_every_position(text, starts_in_reasoning, reasoning, content):
    expected = ReasoningResult(reasoning, content)
    assert parse_reasoning(text, starts_in_reasoning) == expected
    for chunks in every_chunking(text) if text else [[""]]:
        assert stream(chunks, starts_in_reasoning) == expected, chunks


def test_three_piece_splits_of_both_tags():
    text = " <think> r1 r2 </think> c1 c2"
    expected = ReasoningResult("r1 r2", "c1 c2")
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        assert stream([text[:i], text[i:j], text[j:]]) == expected, (i, j)


def test_reasoning_streams_before_the_close_tag():
    parser = ReasoningParser()
    assert parser.feed("<think>step one") == [ReasoningDelta("step one")]
    assert parser.feed(" then </th") == [ReasoningDelta(" then")]
    assert parser.feed("ink>\n") == []
    assert parser.feed("Answer") == [ContentDelta("Answer")]
    assert parser.finish() == []


def test_prompt_opens_reasoning():
    assert prompt_opens_reasoning("<|assistant|>\n<think>")
    assert prompt_opens_reasoning("<|assistant|><think>\n")
    assert not prompt_opens_reasoning("<|assistant|><think></think>")
    assert not prompt_opens_reasoning("<|im_start|>assistant\n")
    assert not prompt_opens_reasoning("<think>old</think><|assistant|>")
