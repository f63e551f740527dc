"""Tokenizers and chat templates: Kimi's tiktoken tokenizer (ours) and GLM's tokenizer.json.

Round trips, special tokens, partial UTF-8, the chat templates with tools,
tool calls and thinking, and model output surviving encode/decode into the
engine's tool-call parsers.
"""

from __future__ import annotations

import json
from itertools import groupby

import jinja2
import pytest

from engine.chat.tool_parsers import Glm45ToolParser, KimiK2ToolParser, detect_tool_parser
from engine.devtools.testing.chat_templates import GLM45_TEMPLATE, KIMI_K2_TEMPLATE
from engine.devtools.testing.tokenizers import (
    KIMI_NUM_RANKS,
    KIMI_PATTERN,
    KIMI_VOCAB_SIZE,
    glm_token_id,
    kimi_ranks,
    kimi_token_id,
    save_glm_tokenizer,
    save_kimi_tokenizer,
    train_byte_bpe,
)
from engine.errors import CheckpointError
from engine.tokenizers import KimiTokenizer
from engine.tokenizers.byte_pieces import piece_to_bytes
from engine.tokenizers.detokenizer import IncrementalDetokenizer
from engine.tokenizers.kimi import MAX_RUN_CHARS, _bounded_runs
from engine.tokenizers.loading import load_tokenizer
from engine.tokenizers.ranks import write_ranks

TEXTS = {
    "empty": "",
    "ascii": "The quick brown fox jumps over the lazy dog. It's 2026!",
    "code": "def add(a, b):\n\treturn a + b  # sum\n\n\nclass X:\r\n    pass\n",
    "unicode": "héllo wörld — naïve café, Ελληνικά, русский, עברית, e\u0301",
    "cjk": "读取文件，然后运行测试。中文English混合123",
    "emoji": "ship it 🎉🚀 👩‍💻 done",
    "whitespace": "   leading\n\n\n    indented\t\ttabs   \n",
}
KIMI_SPECIALS = [
    "<|im_user|>",
    "<|im_assistant|>",
    "<|im_system|>",
    "<|im_middle|>",
    "<|im_end|>",
    "[BOS]",
    "[EOS]",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<think>",
    "</think>",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Read 中文.md 🎉"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Need the file.",
        "tool_calls": [
            {
                "id": "functions.read_file:0",
                "type": "function",
                "function": {"name": "read_file", "arguments": {"path": "中文.md", "limit": 5}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "functions.read_file:0", "content": "# 标题\nhello"},
]


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> KimiTokenizer:
    folder = tmp_path_factory.mktemp("kimi_tokenizer")
    save_kimi_tokenizer(folder)
    return load_tokenizer(folder)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("glm_tokenizer")
    save_glm_tokenizer(folder, 384)
    (folder / "config.json").write_text(json.dumps({"model_type": "glm4_moe"}))
    return load_tokenizer(folder)


# ----- Kimi: loading -------------------------------------------------------------------


def test_kimi_folder_loads_our_tokenizer_without_running_its_code(kimi):
    # The folder's tokenization_kimi.py raises if executed; loading got here.
    assert isinstance(kimi, KimiTokenizer)
    assert len(kimi) == kimi.vocab_size == KIMI_VOCAB_SIZE
    assert (kimi.bos_token, kimi.eos_token, kimi.pad_token, kimi.unk_token) == (
        "[BOS]",
        "[EOS]",
        "[PAD]",
        "[UNK]",
    )
    assert kimi.eos_token_id == kimi_token_id("[EOS]") == KIMI_NUM_RANKS + 1
    assert kimi.bos_token_id == KIMI_NUM_RANKS
    for token in KIMI_SPECIALS:
        assert kimi.convert_tokens_to_ids(token) == kimi_token_id(token)
        assert kimi.added_tokens_decoder[kimi_token_id(token)].special
    # Ids Kimi's config leaves unnamed are reserved tokens, as Kimi's own code names them.
    assert f"<|reserved_token_{KIMI_NUM_RANKS + 5}|>" in kimi.all_special_tokens
    assert kimi.chat_template == KIMI_K2_TEMPLATE


def test_bad_ranks_files_fail_with_the_line(tmp_path):
    save_kimi_tokenizer(tmp_path)
    ranks_file = tmp_path / "tiktoken.model"
    lines = ranks_file.read_text().splitlines()
    ranks_file.write_text("\n".join(lines[:3] + ["not-base64"] + lines[3:]) + "\n")
    with pytest.raises(CheckpointError, match=r"tiktoken.model:4"):
        load_tokenizer(tmp_path)
    write_ranks(ranks_file, {bytes([b]): b for b in range(255)})
    with pytest.raises(CheckpointError, match="single bytes have no rank"):
        load_tokenizer(tmp_path)
    # A special token numbered inside the ranks would shadow a real token.
    write_ranks(ranks_file, kimi_ranks())
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["7"] = {"content": "<|bad|>", "special": True}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="special ids start at"):
        load_tokenizer(tmp_path)


# ----- Kimi: encoding and decoding ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_kimi_round_trips(kimi, name):
    text = TEXTS[name]
    ids = kimi.encode(text)
    assert kimi.decode(ids) == text
    assert kimi.decode(ids, skip_special_tokens=True) == text
    assert kimi.convert_tokens_to_string(kimi.convert_ids_to_tokens(ids)) == text
    assert all(0 <= i < KIMI_NUM_RANKS for i in ids)  # plain text never yields special ids


def test_kimi_bpe_matches_the_bpe_its_ranks_came_from(kimi):
    """Independent check of the ranks and Kimi's split pattern: tiktoken and HF tokenizers agree."""
    reference = train_byte_bpe(KIMI_NUM_RANKS, KIMI_PATTERN)
    for text in TEXTS.values():
        ours = [kimi.convert_ids_to_tokens(i) for i in kimi.encode(text)]
        theirs = reference.encode(text).tokens
        assert [piece_to_bytes(t) for t in ours] == [piece_to_bytes(t) for t in theirs]


def test_han_runs_are_pieces_of_their_own(kimi):
    ids = kimi.encode("abc中文def读取")
    pieces = [piece_to_bytes(token) for token in kimi.convert_ids_to_tokens(ids)]
    assert b"".join(pieces) == "abc中文def读取".encode()
    # No token mixes the Latin letters (ASCII bytes) with Han (UTF-8 bytes >= 0x80).
    assert all(p.isascii() or not any(b < 0x80 for b in p) for p in pieces), pieces


def test_special_tokens_in_text_are_read_as_specials(kimi):
    text = "<|im_user|>user<|im_middle|>hi <|im_end|>x<|im_end|>"
    ids = kimi.encode(text, add_special_tokens=False)
    assert ids[0] == kimi_token_id("<|im_user|>")
    assert ids.count(kimi_token_id("<|im_end|>")) == 2
    assert kimi.decode(ids) == text
    assert kimi.decode(ids, skip_special_tokens=True) == "userhi x"
    # Kimi adds no BOS, whatever add_special_tokens says.
    assert kimi.encode("hi") == kimi.encode("hi", add_special_tokens=False)
    # split_special_tokens reads the markers as plain text.
    plain = kimi.encode(text, split_special_tokens=True)
    assert all(i < KIMI_NUM_RANKS for i in plain) and kimi.decode(plain) == text


def test_partial_multibyte_sequences_decode_to_replacement_chars(kimi):
    ids = kimi.encode("🎉")
    assert len(ids) == 4  # emoji are not merged in the tiny vocabulary
    for cut in range(1, 4):
        assert kimi.decode(ids[:cut]).endswith("\ufffd")
    assert kimi.decode(ids) == "🎉"


def test_incremental_detokenizer_never_emits_half_a_character(kimi):
    text = "写代码 🎉 ok <|im_end|>"
    ids = kimi.encode(text)
    detok = IncrementalDetokenizer(kimi, kimi.encode("prompt"), skip_special_tokens=False)
    deltas = [detok.add(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + detok.flush() == text


def test_vocabulary_and_token_names(kimi):
    vocab = kimi.get_vocab()
    assert len(vocab) == KIMI_VOCAB_SIZE
    assert vocab["Ġthe"] == kimi.encode(" the")[0]
    assert vocab["<|im_end|>"] == kimi_token_id("<|im_end|>")
    assert kimi.convert_ids_to_tokens(kimi_token_id("<|im_end|>")) == "<|im_end|>"
    assert kimi.convert_tokens_to_ids("no such token") == kimi.unk_token_id
    # Ids past the vocabulary are dropped, as Hugging Face's fast tokenizers do.
    assert kimi.decode([*kimi.encode("ok"), KIMI_VOCAB_SIZE + 3]) == "ok"


def test_long_runs_are_encoded_in_slices_and_still_round_trip(kimi):
    text = "x" * (MAX_RUN_CHARS + 10) + " " * (MAX_RUN_CHARS + 5) + "end"
    slices = list(_bounded_runs(text, MAX_RUN_CHARS))
    assert "".join(slices) == text and len(slices) == 3
    runs = [len(list(run)) for s in slices for _, run in groupby(s, key=str.isspace)]
    assert max(runs) <= MAX_RUN_CHARS
    assert kimi.decode(kimi.encode(text)) == text


# ----- chat templates ------------------------------------------------------------------


def test_kimi_template_renders_tools_calls_thinking_and_results(kimi):
    text = kimi.apply_chat_template(
        CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    # Kimi sorts tool schema keys before rendering; declarations are compact JSON.
    tools_json = json.dumps(
        [{"function": {"description": "Read a file", "name": "read_file", "parameters": {
            "properties": {"limit": {"type": "integer"}, "path": {"type": "string"}},
            "required": ["path"], "type": "object"}}, "type": "function"}],
        separators=(",", ":"),
    )  # fmt: skip
    expected = (
        f"<|im_system|>tool_declare<|im_middle|>{tools_json}<|im_end|>"
        "<|im_system|>system<|im_middle|>You are terse.<|im_end|>"
        "<|im_user|>user<|im_middle|>Read 中文.md 🎉<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|><think>Need the file.</think>"
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0"
        '<|tool_call_argument_begin|>{"path": "中文.md", "limit": 5}<|tool_call_end|>'
        "<|tool_calls_section_end|><|im_end|>"
        "<|im_system|>tool<|im_middle|>## Return of functions.read_file:0\n# 标题\nhello<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>"
    )
    assert text == expected
    ids = kimi.apply_chat_template(CONVERSATION, tools=TOOLS, add_generation_prompt=True)[
        "input_ids"
    ]
    assert ids == kimi.encode(text, add_special_tokens=False)
    assert kimi.decode(ids) == text
    assert ids.count(kimi_token_id("<|im_end|>")) == text.count("<|im_end|>") == 5
    assert kimi_token_id("<|tool_call_argument_begin|>") in ids
    assert detect_tool_parser("kimi_k2", kimi.chat_template) == "kimi_k2"


def test_kimi_template_options(kimi):
    chat = [{"role": "user", "content": "hi"}]
    default = kimi.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert default.startswith("<|im_system|>system<|im_middle|>You are Kimi")
    assert default.endswith("<|im_assistant|>assistant<|im_middle|>")
    no_think = kimi.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=False, thinking=False
    )
    assert no_think == default + "<think></think>"
    # Earlier assistant turns keep an empty think block; their reasoning is not replayed.
    history = [*chat, {"role": "assistant", "content": "yo", "reasoning": "r"}, *chat]
    assert "<think></think>yo<|im_end|>" in kimi.apply_chat_template(history, tokenize=False)
    prefill = [*chat, {"role": "assistant", "content": "Sure,"}]
    continued = kimi.apply_chat_template(prefill, continue_final_message=True, tokenize=False)
    assert continued.endswith("<|im_assistant|>assistant<|im_middle|><think></think>Sure,")
    assert kimi.apply_chat_template(chat, return_dict=False) == kimi.encode(
        kimi.apply_chat_template(chat, tokenize=False)
    )


def test_templates_run_sandboxed_with_hf_helpers(kimi):
    chat = [{"role": "user", "content": "hi"}]
    with pytest.raises(jinja2.TemplateError, match="no system"):
        kimi.apply_chat_template(chat, chat_template="{{ raise_exception('no system') }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        kimi.apply_chat_template(
            chat, tokenize=False, chat_template="{{ messages.__class__.__mro__ }}"
        )
    year = kimi.apply_chat_template(chat, tokenize=False, chat_template="{{ strftime_now('%Y') }}")
    assert year.isdigit()
    tojson = "{% generation %}{{ messages | tojson(indent=1) }}{% endgeneration %}"
    assert json.loads(kimi.apply_chat_template(chat, tokenize=False, chat_template=tojson)) == chat


def test_glm_template_renders_tools_calls_thinking_and_results(glm):
    text = glm.apply_chat_template(
        CONVERSATION, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in text
    assert text.endswith(
        "<|system|>\nYou are terse.<|user|>\nRead 中文.md 🎉<|assistant|>\n<think>Need the file.</think>"
        "\n<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>中文.md</arg_value>"
        "\n<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n</tool_call>"
        "<|observation|>\n<tool_response>\n# 标题\nhello\n</tool_response><|assistant|>"
    )
    ids = glm.encode(text, add_special_tokens=False)
    assert glm.decode(ids, skip_special_tokens=False) == text
    # <tool_call> and <arg_key> are single (ordinary) added tokens.
    assert ids.count(glm_token_id("<tool_call>")) == 2  # the format example and the call
    assert ids.count(glm_token_id("<arg_key>")) == 3
    assert detect_tool_parser("glm4_moe", GLM45_TEMPLATE) == "glm45"
    no_think = glm.apply_chat_template(
        CONVERSATION[:2], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    assert no_think.endswith("🎉/nothink<|assistant|>\n<think></think>")


def test_glm_skip_special_tokens_keeps_tool_tags(glm):
    text = "<|assistant|>\n<think>hm</think>\n<tool_call>f\n<arg_key>a</arg_key>"
    ids = glm.encode(text, add_special_tokens=False)
    assert glm.decode(ids, skip_special_tokens=True) == text.removeprefix("<|assistant|>")


# ----- model output into the tool-call parsers ----------------------------------------

KIMI_OUTPUT = (
    "<think>The user wants 中文.md.</think>Reading it 🎉"
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0"
    '<|tool_call_argument_begin|>{"path": "docs/中文.md", "limit": 5}<|tool_call_end|>'
    "<|tool_calls_section_end|><|im_end|>"
)
GLM_OUTPUT = (
    "\n<think>The user wants 中文.md.</think>\nReading it 🎉"
    "\n<tool_call>read_file\n<arg_key>path</arg_key>\n<arg_value>docs/中文.md</arg_value>"
    "\n<arg_key>limit</arg_key>\n<arg_value>5</arg_value>\n</tool_call>"
)


def _streamed_text(tokenizer, ids, skip_special_tokens):
    detok = IncrementalDetokenizer(tokenizer, [], skip_special_tokens=skip_special_tokens)
    return "".join(detok.add(i) for i in ids) + detok.flush()


def test_kimi_tool_call_survives_encode_and_decode(kimi):
    ids = kimi.encode(KIMI_OUTPUT)
    for text in (kimi.decode(ids, skip_special_tokens=False), _streamed_text(kimi, ids, False)):
        body = text.split("</think>")[1].removesuffix("<|im_end|>")
        message = KimiK2ToolParser(tools=TOOLS).parse_complete(body)
        assert message.errors == [] and message.content == "Reading it 🎉"
        [call] = message.tool_calls
        assert (call.id, call.name) == ("functions.read_file:0", "read_file")
        assert json.loads(call.arguments_json) == {"path": "docs/中文.md", "limit": 5}


def test_glm_tool_call_survives_encode_and_decode(glm):
    ids = glm.encode(GLM_OUTPUT, add_special_tokens=False)
    # The GLM tags are ordinary tokens, so the default skip_special_tokens=True keeps them.
    for text in (glm.decode(ids, skip_special_tokens=True), _streamed_text(glm, ids, True)):
        assert text == GLM_OUTPUT
        message = Glm45ToolParser(tools=TOOLS).parse_complete(text.split("</think>")[1])
        assert message.errors == [] and message.content.strip() == "Reading it 🎉"
        [call] = message.tool_calls
        assert call.name == "read_file"
        assert json.loads(call.arguments_json) == {"path": "docs/中文.md", "limit": 5}


# ----- load_tokenizer for the other forms -----------------------------------------------


def test_tokenizer_json_loads_whatever_model_type_config_names(tmp_path):
    # AutoTokenizer would read config.json through AutoConfig, which rejects kimi_k2.
    save_glm_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k2"}))
    tokenizer = load_tokenizer(tmp_path)
    assert tokenizer.decode(tokenizer.encode("hi there")) == "hi there"


def test_folder_whose_tokenizer_needs_its_code_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "kimi_k2"}))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"auto_map": {"AutoTokenizer": ["tok.Tok", None]}, "tokenizer_class": "Tok"})
    )
    (tmp_path / "tok.py").write_text("raise RuntimeError('checkpoint code ran')\n")
    with pytest.raises(CheckpointError, match="without running checkpoint code"):
        load_tokenizer(tmp_path)
