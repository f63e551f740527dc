"""Registry.parse reads a model's arguments within limits (tools.schema.load_arguments; issue 38).

Nesting past MAX_ARGUMENT_DEPTH, text past MAX_ARGUMENT_CHARS, numbers JSON
cannot hold and integers past Python's digit limit are each a ToolResult error
that says why, never an exception: the registry is what the agent loop trusts
to turn any call into a result.
"""

from __future__ import annotations

import pytest

from tools import ToolResult, default_registry
from tools.schema import (
    MAX_ARGUMENT_CHARS,
    MAX_ARGUMENT_DEPTH,
    ArgumentShapeError,
    load_arguments,
)


def nested_list(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture(scope="module")
def registry():
    return default_registry()


def error_of(registry, arguments) -> str:
    result = registry.parse("read", arguments, "call_1")
    assert isinstance(result, ToolResult) and not result.ok
    return result.output


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH + 1, 2_000, 100_000])
def test_deep_text_is_refused_before_anything_recurses(registry, depth):
    output = error_of(registry, '{"path": ' + nested_list(depth - 1) + "}")
    assert f"were refused: they nest deeper than {MAX_ARGUMENT_DEPTH} levels" in output
    assert '"path": string' in output  # what to send instead


def test_the_deepest_allowed_arguments_reach_validation(registry):
    output = error_of(registry, '{"path": ' + nested_list(MAX_ARGUMENT_DEPTH - 1) + "}")
    assert output.startswith("Invalid arguments for 'read'")


def test_arguments_handed_over_parsed_get_the_same_limit(registry):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    assert "nest deeper than" in error_of(registry, {"path": deep})


def test_text_past_the_size_cap_is_refused_unread(registry):
    text = '{"path": "' + "x" * MAX_ARGUMENT_CHARS + '"}'
    assert "a tool call may carry" in error_of(registry, text)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"path": ' + "9" * 5_000 + "}", "not valid JSON"),
        ('{"path": "a", "limit": Infinity}', "Infinity is not JSON"),
        ('{"path": "a", "limit": -1e999}', "not a finite number"),
    ],
    ids=["digits", "infinity", "overflow"],
)
def test_numbers_python_or_json_cannot_hold(registry, text, words):
    assert words in error_of(registry, text)


def test_load_arguments_reads_ordinary_arguments():
    assert load_arguments('{"path": "a.py", "limit": 3, "x": [[1.5]]}') == {
        "path": "a.py",
        "limit": 3,
        "x": [[1.5]],
    }
    with pytest.raises(ValueError):  # JSONDecodeError, which callers already catch
        load_arguments('{"path": ')
    assert issubclass(ArgumentShapeError, ValueError)
