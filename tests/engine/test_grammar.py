"""engine.grammar without a model: vocabularies, tool-call grammars against the parsers,
schema support, matcher state and masks.

The tiny GLM (Hugging Face byte-level BPE, `<tool_call>` an ordinary added
token, padded vocabulary) and Kimi (tiktoken, markers as special tokens)
tokenizers stand for the real ones.
"""

from __future__ import annotations

import json

import pytest
import torch
import xgrammar as xgr

from engine.chat.json_schema import schema_errors
from engine.chat.tool_parsers import get_tool_parser
from engine.devtools.testing.tokenizers import (
    GLM_EOS_TOKENS,
    GLM_VOCAB_SIZE,
    glm_token_id,
    kimi_token_id,
    save_glm_tokenizer,
    save_kimi_tokenizer,
)
from engine.errors import EngineError
from engine.grammar import GrammarError, StructuredOutput
from engine.grammar.backend import GrammarBackend
from engine.grammar.builder import build_grammar
from engine.grammar.masks import apply_grammar_masks
from engine.grammar.schema_bounds import bound_numbers
from engine.grammar.schema_support import check_schema
from engine.grammar.vocab import build_tokenizer_info
from engine.requests.params import SamplingParams
from engine.tokenizers.loading import load_tokenizer

READ = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "maxLength": 40},
        "limit": {"type": "integer", "minimum": 1},
    },
    "required": ["path"],
    "additionalProperties": False,
}
SHELL = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": READ}},
    {"type": "function", "function": {"name": "shell", "parameters": SHELL}},
]


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm_tokenizer")
    save_glm_tokenizer(folder, GLM_VOCAB_SIZE)
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def kimi(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kimi_tokenizer")
    save_kimi_tokenizer(folder)
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def glm_backend(glm):
    return GrammarBackend(glm, GLM_VOCAB_SIZE, [glm_token_id(t) for t in GLM_EOS_TOKENS])


@pytest.fixture(scope="module")
def kimi_backend(kimi):
    return GrammarBackend(kimi, len(kimi), [kimi_token_id("[EOS]"), kimi_token_id("<|im_end|>")])


def accepts(backend: GrammarBackend, spec: StructuredOutput, text: str) -> bool:
    """Whether `text` followed by a stop token is a complete output under `spec`."""
    matcher = backend.request_grammar(spec).matcher
    return matcher.accept_string(text) and matcher.accept_token(backend.stop_token_ids[0])


# ----- vocabularies -----------------------------------------------------------------------


def test_glm_vocabulary_keeps_markers_and_stops_and_blanks_other_specials(glm):
    stops = [glm_token_id(t) for t in GLM_EOS_TOKENS]
    info = build_tokenizer_info(glm, GLM_VOCAB_SIZE, stops)
    vocab = info.decoded_vocab
    assert info.vocab_size == GLM_VOCAB_SIZE
    assert vocab[glm_token_id("<tool_call>")] == b"<tool_call>"  # an ordinary added token
    assert vocab[glm_token_id("<|user|>")] == b"<|user|>"  # special, but a stop token
    assert vocab[glm_token_id("[gMASK]")] == b""  # special: never part of an output
    assert all(piece == b"" for piece in vocab[len(glm) :])  # the padded lm_head rows
    assert sorted(info.stop_token_ids) == sorted(stops)
    text = 'print("héllo")\n<tool_call>'
    ids = glm.encode(text, add_special_tokens=False)
    assert b"".join(vocab[i] for i in ids) == text.encode()


def test_kimi_vocabulary_is_read_from_its_byte_level_pieces(kimi):
    info = build_tokenizer_info(kimi, len(kimi), [kimi_token_id("[EOS]")])
    vocab = info.decoded_vocab
    for marker in ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<think>"):
        assert vocab[kimi_token_id(marker)] == marker.encode()  # grammars write these
    assert vocab[kimi_token_id("<|im_user|>")] == b""
    text = "读取 file.py 🎉 — done"
    ids = kimi.encode(text)
    assert b"".join(vocab[i] for i in ids) == text.encode()


def test_a_grammar_needs_a_stop_token(glm):
    with pytest.raises(ValueError, match="stop token"):
        build_tokenizer_info(glm, GLM_VOCAB_SIZE, [])


# ----- tool calls: what the grammar allows is what the parsers read ------------------------

CALLS = {
    "hermes": '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py", "limit": 3}}\n</tool_call>',
    "glm45": "<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>a.py</arg_value>\n"
    "<arg_key>limit</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    "glm47": "<tool_call>read_file<arg_key>path</arg_key><arg_value>a.py</arg_value>"
    "<arg_key>limit</arg_key><arg_value>3</arg_value></tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0"
    '<|tool_call_argument_begin|>{"path": "a.py", "limit": 3}<|tool_call_end|>'
    "<|tool_calls_section_end|>",
}
SECOND = {
    "hermes": '\n<tool_call>\n{"name": "shell", "arguments": {"command": "ls"}}\n</tool_call>',
    "glm45": "\n<tool_call>shell\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>",
    "glm47": "<tool_call>shell<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call>",
}


def backend_for_format(name, glm_backend, kimi_backend):
    return kimi_backend if name == "kimi_k2" else glm_backend


@pytest.mark.parametrize("name", sorted(CALLS))
def test_required_calls_are_accepted_and_parse_into_valid_arguments(
    name, glm_backend, kimi_backend
):
    backend = backend_for_format(name, glm_backend, kimi_backend)
    spec = StructuredOutput.for_tool_calls(name, TOOLS, required=True)
    text = CALLS[name]
    assert accepts(backend, spec, text)
    parsed = get_tool_parser(name)(TOOLS).parse_complete(text)
    assert [call.name for call in parsed.tool_calls] == ["read_file"] and not parsed.errors
    assert json.loads(parsed.tool_calls[0].arguments_json) == {"path": "a.py", "limit": 3}
    if name in SECOND:  # parallel calls; Kimi's second call goes inside the same section
        assert accepts(backend, spec, text + SECOND[name])
    assert not accepts(backend, spec, "Sure! " + text)  # required: calls and nothing else
    assert not accepts(backend, spec, "")


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_call_that_breaks_its_schema_is_not_allowed(name, glm_backend, kimi_backend):
    backend = backend_for_format(name, glm_backend, kimi_backend)
    spec = StructuredOutput.for_tool_calls(name, TOOLS, required=True)
    good = CALLS[name]
    broken = [
        good.replace("read_file", "write_file"),  # no such tool
        good.replace("3", "-3"),  # limit has minimum 1
        good.replace("limit", "lines"),  # read_file takes no other properties
    ]
    for text in broken:
        assert not accepts(backend, spec, text), text


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_named_function_gets_exactly_one_call(name, glm_backend, kimi_backend):
    backend = backend_for_format(name, glm_backend, kimi_backend)
    spec = StructuredOutput.for_tool_calls(name, TOOLS[:1], required=True, parallel=False)
    assert accepts(backend, spec, CALLS[name])
    if name in SECOND:
        two = CALLS[name] + SECOND[name].replace("shell", "read_file").replace("command", "path")
        assert not accepts(backend, spec, two)


@pytest.mark.parametrize("name", sorted(CALLS))
def test_auto_leaves_text_free_but_a_started_call_must_be_valid(name, glm_backend, kimi_backend):
    backend = backend_for_format(name, glm_backend, kimi_backend)
    spec = StructuredOutput.for_tool_calls(name, TOOLS, required=False)
    assert accepts(backend, spec, "Just an answer, no call.")
    assert accepts(backend, spec, "Let me look. " + CALLS[name])
    assert not accepts(backend, spec, "Let me look. " + CALLS[name].replace("read_file", "rm"))


def test_kimi_calls_match_as_the_special_tokens_the_model_writes(kimi, kimi_backend):
    spec = StructuredOutput.for_tool_calls("kimi_k2", TOOLS, required=True)
    ids = kimi.encode(CALLS["kimi_k2"])
    assert kimi_token_id("<|tool_call_begin|>") in ids
    matcher = kimi_backend.request_grammar(spec).matcher
    assert all(matcher.accept_token(i) for i in ids)
    assert matcher.accept_token(kimi_token_id("[EOS]"))
    free = StructuredOutput.for_tool_calls("kimi_k2", TOOLS, required=False)
    # A bare call outside a section would escape the grammar; the free text may not hold one.
    assert not accepts(kimi_backend, free, "ok " + CALLS["kimi_k2"].split("section_begin|>")[1])


def test_a_json_answer_or_calls(glm_backend):
    spec = StructuredOutput(
        json_schema={"type": "object", "properties": {"city": {"type": "string"}}},
        tool_calls=StructuredOutput.for_tool_calls("hermes", TOOLS, required=True).tool_calls,
    )
    assert accepts(glm_backend, spec, '{"city": "Paris"}')
    assert accepts(glm_backend, spec, CALLS["hermes"])
    assert not accepts(glm_backend, spec, "Paris")


@pytest.mark.parametrize(
    ("mode", "good", "bad"),
    [
        ("open", "I should answer.</think>\n\n{}", "{}"),
        ("optional", "<think>hm</think>\n{}", "hm</think>{}"),
        ("optional", "{}", "Sure: {}"),
    ],
)
def test_reasoning_before_the_answer(glm_backend, mode, good, bad):
    spec = StructuredOutput.for_json_object(reasoning=mode)
    assert accepts(glm_backend, spec, good)
    assert not accepts(glm_backend, spec, bad)


# ----- schemas ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (
            {"type": "object", "properties": {"a": {"not": {"type": "string"}}}},
            "schema.properties.a",
        ),
        ({"type": "array", "uniqueItems": True}, "schema"),
        ({"if": {"type": "string"}, "then": {"minLength": 2}}, "schema"),
        ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "schema"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "schema"),
        ({"$ref": "https://example.com/schema.json"}, "schema"),
        ({"type": "string", "format": "email", "maxLength": 5}, "schema"),
        ({"type": "number", "multipleOf": 0.5}, "schema"),
        ({"anyOf": [{"type": "string"}, {"contains": {"const": 1}}]}, "schema.anyOf.1"),
    ],
)
def test_keywords_the_grammar_cannot_enforce_are_refused_by_name(schema, where):
    with pytest.raises(GrammarError) as caught:
        check_schema(schema)
    assert caught.value.param == where and "not supported" in str(caught.value)


def test_a_property_may_be_named_like_a_keyword():
    check_schema({"type": "object", "properties": {"not": {"type": "string"}, "if": {}}})


def test_bad_schemas_and_regexes_fail_with_a_clean_message():
    spec = StructuredOutput.for_json_schema({"type": "strnig"}, source="response_format")
    with pytest.raises(GrammarError, match=r"^response_format: .*strnig") as caught:
        build_grammar(spec)
    assert "/project/" not in str(caught.value) and caught.value.param == "response_format"
    with pytest.raises(GrammarError, match="not closed|parenthesis"):
        build_grammar(StructuredOutput.for_regex("(ab"))
    with pytest.raises(EngineError):  # a GrammarError is an EngineError: a 400, not a 500
        build_grammar(StructuredOutput.for_json_schema({"type": "object", "required": "a"}))


def test_specs_are_checked_when_made():
    with pytest.raises(GrammarError):
        StructuredOutput()
    with pytest.raises(GrammarError):
        StructuredOutput(json_object=True, regex="a+")
    with pytest.raises(GrammarError, match="format"):
        StructuredOutput.for_tool_calls("deepseek", TOOLS, required=True)
    with pytest.raises(GrammarError, match="unique"):
        StructuredOutput.for_tool_calls("hermes", TOOLS + TOOLS[:1], required=True)
    with pytest.raises(EngineError, match="structured"):
        SamplingParams(structured={"type": "json_object"})


def test_json_check_knows_the_keywords_it_is_used_for():
    assert schema_errors({"path": "a", "limit": 2}, READ) == []
    assert schema_errors({"path": "a", "limit": 0}, READ)
    assert schema_errors({"path": "a", "limit": True}, READ)  # a boolean is not an integer
    assert schema_errors({"limit": 2}, READ)
    assert schema_errors({"path": "a", "x": 1}, READ)
    assert schema_errors(3, {"oneOf": [{"type": "integer"}, {"type": "number"}]})
    assert not schema_errors(2.0, {"type": "integer"})
    ref = {"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}}
    assert schema_errors([1, "x"], ref) and not schema_errors([1, 2], ref)


# ----- one request's matcher and the batch's masks -----------------------------------------


class _Seq:
    def __init__(self, grammar=None, logprobs=None):
        self.grammar = grammar
        self.output_token_ids: list[int] = []
        self.params = SamplingParams(logprobs=logprobs)


def test_the_matcher_follows_the_output_tokens(glm, glm_backend):
    grammar = glm_backend.request_grammar(StructuredOutput.for_json_object())
    ids = glm.encode('{"a": 1', add_special_tokens=False)
    grammar.sync(ids)  # behind: catches up
    assert grammar.num_accepted == len(ids) and not grammar.error
    grammar.sync(ids[:2])  # ahead (tokens taken back): rolls back
    assert grammar.num_accepted == 2
    grammar.sync(ids)
    assert grammar.num_accepted == len(ids) and not grammar.error
    other = glm.encode('{"b": 2', add_special_tokens=False)
    grammar.sync(other)  # different tokens, however many: back to where they part
    assert grammar.accepted == other and not grammar.error
    grammar.accept(glm.encode("]", add_special_tokens=False)[0])
    assert grammar.error and grammar.done


def test_masks_touch_only_constrained_rows_and_keep_their_own_logprobs(glm, glm_backend):
    torch.manual_seed(0)
    logits = torch.randn(3, GLM_VOCAB_SIZE)
    before = logits.clone()
    json_object = StructuredOutput.for_json_object()
    seqs = [
        _Seq(),
        _Seq(glm_backend.request_grammar(json_object), logprobs=2),
        _Seq(glm_backend.request_grammar(json_object)),
    ]
    seqs[2].output_token_ids = glm.encode('{"a": ', add_special_tokens=False)
    unmasked = apply_grammar_masks(logits, seqs)
    assert torch.equal(logits[0], before[0])
    assert set(unmasked) == {1} and torch.equal(unmasked[1], before[1])
    assert seqs[2].grammar.num_accepted == len(seqs[2].output_token_ids)
    for row, seq in ((1, seqs[1]), (2, seqs[2])):
        bitmask = xgr.allocate_token_bitmask(1, GLM_VOCAB_SIZE)
        seq.grammar.fill(bitmask, 0)
        allowed = torch.tensor(
            [bool((int(bitmask[0, i // 32]) >> (i % 32)) & 1) for i in range(GLM_VOCAB_SIZE)]
        )
        assert torch.equal(logits[row][allowed], before[row][allowed])
        assert torch.isneginf(logits[row][~allowed]).all() and allowed.any()
        if row == 1:  # nothing written yet: every allowed token opens the object
            vocab = glm_backend.info.decoded_vocab
            assert all(vocab[i].lstrip().startswith(b"{") for i in allowed.nonzero().flatten())


INSIDE_A_STRING = {
    "hermes": (
        '<tool_call>\n{"name": "shell", "arguments": {"command": "ok',
        '</tool_call>"}}\n</tool_call>',
    ),
    "glm47": (
        "<tool_call>shell<arg_key>command</arg_key><arg_value>ok",
        "</arg_value>x</arg_value></tool_call>",
    ),
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.shell:0"
        '<|tool_call_argument_begin|>{"command": "ok',
        '<|tool_call_end|>"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
}


@pytest.mark.parametrize("name", sorted(INSIDE_A_STRING))
def test_closing_markers_stay_out_of_argument_strings(name, glm_backend, kimi_backend):
    """The parsers end arguments at the first closing marker, even inside a string."""
    backend = backend_for_format(name, glm_backend, kimi_backend)
    spec = StructuredOutput.for_tool_calls(name, TOOLS[1:], required=True)
    head, tail = INSIDE_A_STRING[name]
    matcher = backend.request_grammar(spec).matcher
    assert matcher.accept_string(head)
    assert not matcher.accept_string(tail)


def test_a_length_bound_outranks_the_marker_exclusion(glm_backend):
    # xgrammar drops minLength/maxLength where it excludes markers; the bound is kept.
    spec = StructuredOutput.for_tool_calls("hermes", TOOLS[:1], required=True)
    too_long = CALLS["hermes"].replace('"a.py"', '"' + "a" * 41 + '"')
    assert not accepts(glm_backend, spec, too_long)


def test_an_answer_begun_in_the_prompt_is_read_first(glm_backend):
    opened = CALLS["hermes"].index('"arguments"')
    spec = StructuredOutput.for_tool_calls(
        "hermes", TOOLS, required=False, prefix=CALLS["hermes"][:opened]
    )
    assert accepts(glm_backend, spec, CALLS["hermes"][opened:])
    assert not accepts(glm_backend, spec, '"arguments": {"path": 5}}\n</tool_call>')
    with pytest.raises(GrammarError, match="does not fit"):
        glm_backend.request_grammar(StructuredOutput.for_json_object(prefix="[1, "))


def test_unbounded_numbers_get_a_bound_so_digits_cannot_run_on(glm_backend):
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1},
            "x": {"type": ["number", "null"]},
            "k": {"type": "integer", "enum": [1, 2]},
        },
    }
    spec = StructuredOutput.for_json_schema(schema)
    assert accepts(glm_backend, spec, '{"n": 9223372036854775807, "x": -12.5}')
    assert not accepts(glm_backend, spec, '{"n": 1' + "0" * 19 + "}")  # past int64
    assert not accepts(glm_backend, spec, '{"x": 1' + "0" * 16 + "}")
    assert accepts(glm_backend, spec, '{"x": null, "k": 2}')
    assert bound_numbers(schema)["properties"]["k"] == schema["properties"]["k"]
    assert schema["properties"]["n"] == {"type": "integer", "minimum": 1}  # not changed in place


@pytest.mark.parametrize("written", ["", '{"a": "some text', '{"a": [1, '])
def test_masks_equal_the_bitmask_whichever_way_they_are_applied(glm, glm_backend, written):
    """Mostly masked rows go through torch, mostly allowed ones through xgrammar's kernel."""
    with torch.inference_mode():  # as the runner makes them
        logits = torch.randn(2, GLM_VOCAB_SIZE)
    before = logits.clone()
    seq = _Seq(glm_backend.request_grammar(StructuredOutput.for_json_object()))
    seq.output_token_ids = glm.encode(written, add_special_tokens=False)
    apply_grammar_masks(logits, [_Seq(), seq])
    bitmask = xgr.allocate_token_bitmask(1, GLM_VOCAB_SIZE)
    seq.grammar.fill(bitmask, 0)
    bits = [(int(bitmask[0, i // 32]) >> (i % 32)) & 1 for i in range(GLM_VOCAB_SIZE)]
    expected = torch.where(torch.tensor(bits, dtype=torch.bool), before[1], float("-inf"))
    assert torch.equal(logits[1], expected) and torch.equal(logits[0], before[0])


def test_the_grammar_ends_on_a_stop_token_and_a_rollback_reopens_it(glm, glm_backend):
    grammar = glm_backend.request_grammar(StructuredOutput.for_json_object())
    ids = glm.encode('{"a": 1}', add_special_tokens=False) + [glm_backend.stop_token_ids[0]]
    grammar.sync(ids[:-1])
    assert not grammar.terminated
    grammar.sync(ids)
    assert grammar.terminated and grammar.done and not grammar.error
    grammar.sync(ids[:-1])
    assert not grammar.terminated and not grammar.done
