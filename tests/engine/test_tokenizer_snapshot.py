"""A fast tokenizer read back from its snapshot answers as transformers' own does.

Every case loads a folder twice: through transformers (the reference) and
through `load_tokenizer`, whose later loads read the snapshot without
importing transformers. Both are asked the same things on hostile text
(special tokens written in text, half-written ones, control characters,
long runs, mixed scripts) and random ids, including ids past the vocabulary.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.devtools.testing.chat_templates import CHATML_TEMPLATE
from engine.devtools.testing.tokenizers import (
    CORPUS,
    GLM_SPECIAL_TOKENS,
    GLM_TEXT_TOKENS,
    save_bpe_tokenizer,
    save_glm_tokenizer,
    train_byte_bpe,
)
from engine.grammar.vocab import build_tokenizer_info
from engine.model_files.store import default_model_dir, is_complete
from engine.tokenizers.loading import load_tokenizer, snapshot_path
from engine.tokenizers.snapshot import SnapshotTokenizer

TEXTS = [
    "",
    " ",
    "Hello, world!",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n\r\n\n",
    "digits 1234567890 and 3.14159",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|><|im_start|><|endoftext|>",
    "half a special <|im_sta and <|im_end",
    "emoji 🙂🚀, 中文字符, עברית, ünïcödé e\u0301",
    "\x00nul \x01 control \x7f",
    "a" * 3000,
    " " * 500 + "x",
    "\u200bzero\u200bwidth",
    "<think>reasoning</think>answer",
    "def f(x):\n    return x ** 2  # squared\n",
    *GLM_SPECIAL_TOKENS,
    " ".join(GLM_TEXT_TOKENS),
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2? <|im_end|> 🙂"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3+3?"},
]


def _folder_with(tmp_path: Path, tokenizer: Tokenizer, config: dict) -> Path:
    folder = tmp_path / "tok"
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def _chatml(tmp_path: Path) -> Path:
    save_bpe_tokenizer(tmp_path / "tok", 400)
    return tmp_path / "tok"


def _glm(tmp_path: Path) -> Path:
    save_glm_tokenizer(tmp_path / "tok")
    return tmp_path / "tok"


def _default_model(tmp_path: Path) -> Path:
    if not is_complete(default_model_dir()):
        pytest.skip("default model not pulled: resident models pull")
    return default_model_dir()


def _adds_bos(tmp_path: Path) -> Path:
    """No post-processor, add_bos_token set: transformers writes one that adds BOS."""
    tokenizer = train_byte_bpe(400, special_tokens=["<|endoftext|>", "<|im_end|>"], corpus=CORPUS)
    tokenizer.post_processor = None
    config = {"add_bos_token": True, "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
    return _folder_with(tmp_path, tokenizer, config | {"chat_template": CHATML_TEMPLATE})


def _names_missing_specials(tmp_path: Path) -> Path:
    """Named special tokens the vocabulary lacks: transformers adds them."""
    tokenizer = train_byte_bpe(400, special_tokens=["<|endoftext|>"], corpus=CORPUS)
    config = {
        "eos_token": "<|end-of-turn|>",
        "unk_token": {
            "__type": "AddedToken",
            "content": "<unk>",
            "lstrip": True,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": True,
        },
        "pad_token": "<|endoftext|>",
        "extra_special_tokens": ["<|tool|>"],
    }
    return _folder_with(tmp_path, tokenizer, config)


def _truncates_and_pads(tmp_path: Path) -> Path:
    """tokenizer.json with truncation and padding on: transformers encodes without them."""
    tokenizer = train_byte_bpe(400, special_tokens=["<|endoftext|>"], corpus=CORPUS)
    tokenizer.enable_truncation(max_length=8)
    tokenizer.enable_padding(length=16, pad_id=0, pad_token="<|endoftext|>")
    return _folder_with(tmp_path, tokenizer, {"eos_token": "<|endoftext|>"})


def _wordpiece(tmp_path: Path) -> Path:
    """Not BPE: a clean-up of spaces asked for per call runs (transformers 5 skips it for BPE)."""
    return _folder_with(tmp_path, _trained_wordpiece(), {"unk_token": "[UNK]"})


def _trained_wordpiece() -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[UNK]"])
    tokenizer.train_from_iterator(CORPUS + ["it's done . isn't it ?"], trainer)
    return tokenizer


FOLDERS = {
    "wordpiece": _wordpiece,
    "chatml": _chatml,
    "glm45": _glm,
    "smollm2": _default_model,
    "adds_bos": _adds_bos,
    "missing_specials": _names_missing_specials,
    "truncation_and_padding": _truncates_and_pads,
}


def _same(method, *args, **kwargs):
    """A call's result, or the kind of error it raised (both sides must agree on either)."""
    try:
        return method(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - comparing failures too
        return ("raised", type(error).__name__)


def _added(tokenizer) -> dict:
    return {
        i: (t.content, t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
        for i, t in tokenizer.added_tokens_decoder.items()
    }


@pytest.fixture(params=sorted(FOLDERS))
def pair(request, tmp_path):
    folder = FOLDERS[request.param](tmp_path)
    reference = PreTrainedTokenizerFast.from_pretrained(str(folder))
    load_tokenizer(folder)  # the first load writes the snapshot
    ours = load_tokenizer(folder)
    assert isinstance(ours, SnapshotTokenizer), "a later load reads the snapshot"
    return ours, reference


def test_encoding_is_transformers_encoding(pair):
    ours, reference = pair
    for text in TEXTS:
        for specials in (True, False):
            expected = reference.encode(text, add_special_tokens=specials)
            assert ours.encode(text, add_special_tokens=specials) == expected, (text, specials)
    assert _same(ours.encode, None) == _same(reference.encode, None)


def test_decoding_and_token_names_are_transformers(pair):
    ours, reference = pair
    size = len(reference)
    rng = random.Random(0)
    specials = list(reference.all_special_ids)
    sequences = [[], [0], list(range(min(size, 64)))]
    sequences += [[rng.randrange(size) for _ in range(40)] + specials for _ in range(8)]
    sequences += [[size + 3], [5, size, 6], specials * 2]
    sequences += [reference.encode(text) for text in TEXTS]
    for ids in sequences:
        for skip in (False, True):
            for method in ("decode", "convert_ids_to_tokens"):
                got = _same(getattr(ours, method), ids, skip_special_tokens=skip)
                expected = _same(getattr(reference, method), ids, skip_special_tokens=skip)
                assert got == expected, (method, ids, skip)
    for text in TEXTS[:6] + ["it's done . isn't it ?"]:
        ids = reference.encode(text)
        expected = reference.decode(ids, clean_up_tokenization_spaces=True)
        assert ours.decode(ids, clean_up_tokenization_spaces=True) == expected, text
    for token_id in (0, size - 1, size + 7, *specials):
        assert ours.convert_ids_to_tokens(token_id) == reference.convert_ids_to_tokens(token_id)
        assert ours.decode(token_id) == reference.decode(token_id)
    names = [*list(reference.get_vocab())[:50], "not-a-token-at-all", *reference.all_special_tokens]
    assert ours.convert_tokens_to_ids(names) == reference.convert_tokens_to_ids(names)
    assert ours.convert_tokens_to_ids(names[0]) == reference.convert_tokens_to_ids(names[0])
    pieces = reference.convert_ids_to_tokens(reference.encode(TEXTS[9]))
    assert ours.convert_tokens_to_string(pieces) == reference.convert_tokens_to_string(pieces)


def test_vocabulary_and_special_tokens_are_transformers(pair):
    ours, reference = pair
    assert ours.get_vocab() == reference.get_vocab()
    assert (len(ours), ours.vocab_size) == (len(reference), reference.vocab_size)
    for name in ("bos", "eos", "unk", "pad"):
        assert getattr(ours, f"{name}_token") == getattr(reference, f"{name}_token"), name
        assert getattr(ours, f"{name}_token_id") == getattr(reference, f"{name}_token_id"), name
    assert ours.all_special_ids == reference.all_special_ids
    assert ours.all_special_tokens == reference.all_special_tokens
    assert ours.special_tokens_map == reference.special_tokens_map
    assert _added(ours) == _added(reference)
    assert ours.added_tokens_encoder == reference.added_tokens_encoder
    assert ours.chat_template == reference.chat_template


def test_chat_template_renders_as_transformers(pair):
    ours, reference = pair
    if reference.chat_template is None:
        return
    for generation_prompt in (True, False):
        expected = reference.apply_chat_template(
            CONVERSATION, add_generation_prompt=generation_prompt, tokenize=False
        )
        assert (
            ours.apply_chat_template(
                CONVERSATION, add_generation_prompt=generation_prompt, tokenize=False
            )
            == expected
        )
    ids = reference.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False)
    assert ours.apply_chat_template(CONVERSATION, tokenize=True, return_dict=False) == ids


def test_grammar_vocabulary_is_the_one_transformers_gives(pair):
    ours, reference = pair
    size = len(reference) + 5  # a padded lm_head
    stops = [reference.eos_token_id or 0]
    expected = build_tokenizer_info(reference, size, stops)
    got = build_tokenizer_info(ours, size, stops)
    assert got.decoded_vocab == expected.decoded_vocab
    assert (got.vocab_type, got.add_prefix_space) == (
        expected.vocab_type,
        expected.add_prefix_space,
    )
    assert got.special_token_ids == expected.special_token_ids


def test_a_later_start_does_not_import_transformers(tmp_path):
    folder = _glm(tmp_path)
    load_tokenizer(folder)
    probe = (
        "import sys\n"
        "from engine.tokenizers.loading import load_tokenizer\n"
        f"tokenizer = load_tokenizer({str(folder)!r})\n"
        "print(type(tokenizer).__name__, 'transformers' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ)
    )
    assert result.stdout.split() == ["SnapshotTokenizer", "False"], result.stderr


def test_an_edited_tokenizer_gets_a_fresh_snapshot(tmp_path):
    folder = _chatml(tmp_path)
    first = load_tokenizer(folder)
    assert first.eos_token == "<|im_end|>"
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    before = snapshot_path(folder)
    config_path.write_text(json.dumps(config | {"eos_token": "<|endoftext|>"}))
    assert snapshot_path(folder) != before
    assert load_tokenizer(folder).eos_token == "<|endoftext|>"


def test_a_damaged_snapshot_is_made_again(tmp_path, caplog):
    folder = _chatml(tmp_path)
    load_tokenizer(folder)
    path = snapshot_path(folder)
    for damage in ("{not json", json.dumps({"format": 1, "backend": "{}"}), json.dumps([])):
        path.write_text(damage)
        tokenizer = load_tokenizer(folder)
        assert tokenizer.encode("<|im_start|>hi") == [1, *tokenizer.encode("hi")]
        assert "ignoring the tokenizer snapshot" in caplog.text
        assert json.loads(path.read_text())["format"] == 1  # written again whole


def test_an_unwritable_cache_still_loads(tmp_path, monkeypatch):
    folder = _chatml(tmp_path)
    blocked = tmp_path / "cache-is-a-file"
    blocked.write_text("")
    monkeypatch.setenv("RESIDENT_CACHE_DIR", str(blocked))
    tokenizer = load_tokenizer(folder)
    assert isinstance(tokenizer, SnapshotTokenizer)
    assert tokenizer.decode(tokenizer.encode("Hello, world!")) == "Hello, world!"


def test_behaviour_outside_the_backend_keeps_transformers(tmp_path):
    """WordPiece with decode's clean-up of spaces always on: that is transformers' Python,
    so no snapshot."""
    config = {"unk_token": "[UNK]", "clean_up_tokenization_spaces": True}
    folder = _folder_with(tmp_path, _trained_wordpiece(), config)
    loaded = load_tokenizer(folder)
    assert isinstance(loaded, PreTrainedTokenizerFast)
    assert not snapshot_path(folder).exists()


def test_a_snapshot_json_cannot_hold_keeps_transformers(tmp_path, monkeypatch):
    from engine.tokenizers import loading

    folder = _chatml(tmp_path)
    monkeypatch.setattr(loading, "take_snapshot", lambda hf: {"format": 1, "odd": object()})
    assert isinstance(load_tokenizer(folder), PreTrainedTokenizerFast)
    assert not snapshot_path(folder).exists()
