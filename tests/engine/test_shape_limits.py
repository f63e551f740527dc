"""JSON from outside the engine read within limits, and sampling numbers checked (issue 38).

`json.loads` recurses into nesting, so 100,000 levels raised RecursionError
out of whatever read it: a tool parser reading a model's call, the renderer
reading a call in a request's history. Numbers that are not finite, and seeds
beyond what torch's generator takes, went on into sampling.
"""

from __future__ import annotations

import json
import math

import pytest

from engine.chat.json_limits import MAX_JSON_DEPTH, JsonShapeError, check_shape, loads_bounded
from engine.chat.tool_parsers import get_tool_parser
from engine.chat.tool_text import call_as_text
from engine.errors import EngineError
from engine.rendering.messages import template_message
from engine.requests.params import SamplingParams
from engine.server.error_responses import from_exception

DEEP = "[" * 100_000 + "]" * 100_000


def nested(depth: int) -> str:
    """An object whose innermost container is `depth` containers down."""
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def test_depth_is_bounded_and_any_depth_is_safe_to_read():
    assert loads_bounded(nested(MAX_JSON_DEPTH)) == json.loads(nested(MAX_JSON_DEPTH))
    with pytest.raises(JsonShapeError, match=f"deeper than {MAX_JSON_DEPTH}") as caught:
        loads_bounded(nested(MAX_JSON_DEPTH + 1))
    assert caught.value.path.startswith("a.0.0")
    for text in (DEEP, '{"a": ' + DEEP + "}"):
        with pytest.raises(JsonShapeError, match="deeper than"):
            loads_bounded(text)
    assert isinstance(JsonShapeError("x"), ValueError)  # callers that catch bad JSON catch it


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('{"temperature": Infinity}', "temperature"),
        ('{"temperature": 1e400}', "temperature"),
        ('{"a": [1, {"b": -Infinity}]}', "a.1.b"),
        ('{"a": [0.5, NaN]}', "a.1"),
        ("1e999", None),
    ],
)
def test_numbers_that_are_not_finite_are_named_by_path(text, path):
    with pytest.raises(JsonShapeError, match="not a finite number") as caught:
        loads_bounded(text)
    assert caught.value.path == path


def test_strict_refuses_the_words_at_parse_time():
    with pytest.raises(ValueError, match="NaN is not valid JSON"):
        loads_bounded('{"x": NaN}', strict=True)


def test_long_flat_lists_pass_and_deep_ones_inside_do_not():
    check_shape({"prompt": list(range(200_000)), "stop": ["a", None, True]})
    with pytest.raises(JsonShapeError):
        check_shape({"prompt": [1, 2, [float("inf")]]})


@pytest.mark.parametrize("parser_name", ["hermes", "kimi_k2", "glm45"])
def test_a_model_writing_deep_arguments_gets_an_error_not_an_exception(parser_name):
    arguments = '{"a": ' + DEEP + "}"
    text = {
        "hermes": f'<tool_call>{{"name": "f", "arguments": {arguments}}}</tool_call>',
        "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
        f"<|tool_call_argument_begin|>{arguments}<|tool_call_end|><|tool_calls_section_end|>",
        "glm45": f"<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>{DEEP}</arg_value>\n</tool_call>",
    }[parser_name]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    message = get_tool_parser(parser_name)(tools).parse_complete(text)
    if parser_name == "glm45":  # GLM values are text unless they read as JSON: kept as text
        assert json.loads(message.tool_calls[0].arguments_json) == {"a": DEEP}
    else:
        assert message.tool_calls == [] and "deeper than" in message.errors[0]


def test_deep_arguments_in_a_requests_history_stay_as_written():
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": DEEP}}
    rendered = template_message({"role": "assistant", "content": "", "tool_calls": [call]}, 0)
    assert rendered["tool_calls"][0]["function"]["arguments"] == DEEP
    assert DEEP in call_as_text(call)


@pytest.mark.parametrize(
    ("fields", "word"),
    [
        ({"temperature": math.inf}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"repetition_penalty": math.inf}, "repetition_penalty"),
        ({"top_p": math.nan}, "top_p"),
        ({"presence_penalty": math.nan}, "presence_penalty"),
        ({"seed": 2**100}, "seed"),
        ({"seed": -(2**63) - 1}, "seed"),
        ({"stop_token_ids": [2**40]}, "stop_token_ids"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ],
)
def test_sampling_params_refuse_what_sampling_cannot_use(fields, word):
    with pytest.raises(EngineError, match=word):
        SamplingParams(**fields)


def test_sampling_params_take_the_whole_seed_range():
    for seed in (-(2**63), 0, 2**64 - 1):
        SamplingParams(seed=seed)


def test_a_recursion_error_while_serving_is_the_requests_fault_not_a_500():
    # A net behind the body reader's bound: whatever still recurses too deeply on a
    # request's shape (a template walking a schema, say) answers 400, not 500.
    error = from_exception(RecursionError("maximum recursion depth exceeded"))
    assert (error.status, error.type) == (400, "invalid_request_error")
    assert "nests too deeply" in error.message
