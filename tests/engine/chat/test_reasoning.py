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
    # A leading </think>: the prompt opened reasoning in a way the renderer missed.
    ("</think>direct answer", False, None, "direct answer"),
    ("\n</think>\n\nanswer", False, None, "answer"),
    ("</thin", False, None, "</thin"),
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


CALL = "<tool_call>"
CALL_CASES = [
    # (output, starts_in_reasoning, reasoning_content, content, left open by a call)
    (
        "<think>I need to think" + CALL + "f</tool_call>",
        False,
        "I need to think",
        CALL + "f</tool_call>",
        True,
    ),
    ("<think>" + CALL + "f", False, None, CALL + "f", True),
    ("prompt opened it \n" + CALL + "x", True, "prompt opened it", CALL + "x", True),
    ("<think>a</think>b" + CALL + "c</think>", False, "a", "b" + CALL + "c</think>", False),
    ("answer first " + CALL, False, None, "answer first " + CALL, False),
    ("<think>a <tool_cal", False, "a <tool_cal", "", False),
]


@pytest.mark.parametrize(("text", "starts", "reasoning", "content", "left_open"), CALL_CASES)
def test_a_tool_call_marker_ends_reasoning(text, starts, reasoning, content, left_open):
    expected = ReasoningResult(reasoning, content)
    assert parse_reasoning(text, starts, (CALL,)) == expected
    for chunks in every_chunking(text):
        parser = ReasoningParser(starts, (CALL,))
        events = [e for chunk in chunks for e in parser.feed(chunk)] + parser.finish()
        got_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        got_content = "".join(e.text for e in events if isinstance(e, ContentDelta))
        assert ReasoningResult(got_reasoning or None, got_content) == expected, chunks
        assert parser.left_open == left_open, chunks


def test_without_markers_tool_markup_in_thinking_is_reasoning():
    assert parse_reasoning("<think>a" + CALL + "b</think>c") == ReasoningResult(
        "a" + CALL + "b", "c"
    )
