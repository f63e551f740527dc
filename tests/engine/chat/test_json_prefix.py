"""The streaming JSON-object check agrees with json.loads, however text arrives."""

from __future__ import annotations

import json
import random

import pytest

from engine.chat.json_prefix import JsonObjectPrefix


def loads_object(text: str) -> bool:
    def refuse(name):
        raise ValueError(name)

    try:
        return isinstance(json.loads(text, parse_constant=refuse), dict)
    except ValueError:
        return False


def accepted(pieces: list[str]) -> tuple[int, JsonObjectPrefix]:
    checker = JsonObjectPrefix()
    return sum(checker.feed(piece) for piece in pieces), checker


VALID = [
    "{}",
    ' \n{"a": 1}\t',
    '{"a": [1, -0, 2.5e-3, 1E+9, true, false, null, {"b": "\\u00e9\\n\\"q\\""}]}',
    '{"nested": {"x": [[], {}, [{"y": ""}]]}, "s": "<|tool_call_end|> </tool_call>"}',
    '{"unicode": "日本語 ✓ 🚀", "a": "tab\\tslash\\/"}',
]
INVALID = [
    ("", 0),
    ("[1]", 0),
    ('{"a": 01}', 7),
    ('{"a": 1,}', 8),
    ('{"a": NaN}', 6),
    ('{"a": "x\ny"}', 8),
    ('{"a": -}', 7),
    ('{"a": 1.}', 8),
    ('{"a" 1}', 5),
    ("{'a': 1}", 1),
    ('{"a": tru}', 9),
    ('{"a": "\\x"}', 8),
    ('{"a": "\\u12g4"}', 11),
]


@pytest.mark.parametrize("text", VALID)
def test_valid_objects_are_accepted_whole_in_any_pieces(text):
    for cut in range(len(text) + 1):
        count, checker = accepted([text[:cut], text[cut:]])
        assert count == len(text) and checker.complete and not checker.failed


@pytest.mark.parametrize(("text", "valid_prefix"), INVALID)
def test_invalid_text_is_refused_from_its_first_wrong_character(text, valid_prefix):
    count, checker = accepted(list(text))
    assert count == valid_prefix
    assert not checker.complete


def test_text_after_a_complete_object_is_refused_without_failing():
    count, checker = accepted(['{"a": 1}  ', "x", " "])
    assert count == len('{"a": 1}  ')
    assert checker.complete and not checker.failed


def test_inside_string_is_tracked():
    checker = JsonObjectPrefix()
    checker.feed('{"a": "<|')
    assert checker.in_string
    checker.feed('"')
    assert not checker.in_string


def test_agrees_with_json_loads_on_random_text():
    rng = random.Random(3)
    alphabet = [*'{}[]",: -0123456789.eE+\\u\nab', '"k"', '"v"', "true", "null", "fals", '{"a": ']
    for _ in range(8000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        whole, checker = accepted([text])
        assert (whole == len(text) and checker.complete) == loads_object(text), text
        cut = rng.randint(0, len(text))
        assert accepted([text[:cut], text[cut:]])[0] == whole, (text, cut)
