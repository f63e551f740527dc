"""Tiny tokenizers in the on-disk forms the real model families ship.

- `save_bpe_tokenizer`: a byte-level BPE `tokenizer.json` with ChatML
  specials (the Llama/Qwen2/GLM-4 dense test models).
- `save_glm_tokenizer`: GLM-4.5's form: byte-level BPE `tokenizer.json` with
  GLM's added tokens. Role and control tokens are special; `<think>`,
  `<tool_call>`, `<arg_key>` and the rest are ordinary added tokens, so they
  survive `skip_special_tokens=True` as they do with the real tokenizer.
- `save_kimi_tokenizer`: Kimi K2's form: a tiktoken ranks file
  (`tiktoken.model`), special tokens numbered after the ranks in
  `tokenizer_config.json`'s `added_tokens_decoder`, and a
  `tokenization_kimi.py` that raises if anything ever runs it.

All three train a byte-level BPE on a small corpus (tokenizers' trainer,
deterministic), so merges exist for common code and English and, for GLM and
Kimi, a few CJK characters, while emoji stay split into bytes (tests need
multi-byte characters that span tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from engine.devtools.testing.chat_templates import CHATML_TEMPLATE, GLM45_TEMPLATE, KIMI_K2_TEMPLATE
from engine.tokenizers.byte_pieces import piece_to_bytes
from engine.tokenizers.kimi import KIMI_PATTERN, RANKS_FILE, KimiTokenizer
from engine.tokenizers.ranks import write_ranks

# The ChatML tokenizer's corpus; unchanged, so existing tests keep their token ids.
CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import os\nimport sys\nprint(sys.argv)\n",
    "Resident keeps a whole repository in context. 0123456789",
]
# GLM and Kimi need more merges than CORPUS has pairs for.
FAMILY_CORPUS = CORPUS + [
    '{"path": "src/main.py", "content": "print(\\"hello\\")", "line": 42, "ok": true}\n',
    "class Engine:\n    def step(self, requests: list[int]) -> dict[str, float]:\n"
    "        for request in requests:\n            yield self.scheduler.schedule(request)\n",
    "Read the file, then run the tests; fix what fails and commit the change.\n",
    "git status && pytest -q tests/engine --maxfail=1 # exit code 0 when passing\n",
    "读取文件，然后运行测试。中文文本的分词。",
]

# The pre-tokenizer GLM-4.5's tokenizer.json splits with before its byte-level step.
GLM_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GLM_SPECIAL_TOKENS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
]
GLM_TEXT_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "/nothink",
]
GLM_BPE_SIZE = 320  # byte alphabet + merges; the added tokens follow
GLM_VOCAB_SIZE = 384  # the model's embedding rows: padded past the tokenizer, as GLM's are
GLM_EOS_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>"]

KIMI_NUM_RANKS = 480  # 256 bytes + 224 merges
KIMI_NUM_RESERVED = 32  # special ids after the ranks (Kimi K2 reserves 256)
KIMI_VOCAB_SIZE = KIMI_NUM_RANKS + KIMI_NUM_RESERVED
# Offsets from the first special id, in the order Kimi K2 numbers them; the
# rest of the reserved block is <|reserved_token_ID|>, then [UNK] and [PAD].
KIMI_SPECIAL_OFFSETS = {
    "[BOS]": 0,
    "[EOS]": 1,
    "<|im_end|>": 2,
    "<|im_user|>": 3,
    "<|im_assistant|>": 4,
    "<|start_header_id|>": 6,
    "<|end_header_id|>": 7,
    "[EOT]": 9,
    "<|im_system|>": 10,
    "<|tool_calls_section_begin|>": 11,
    "<|tool_calls_section_end|>": 12,
    "<|tool_call_begin|>": 13,
    "<|tool_call_argument_begin|>": 14,
    "<|tool_call_end|>": 15,
    "<|im_middle|>": 17,
    "<think>": 22,
    "</think>": 23,
    "[UNK]": KIMI_NUM_RESERVED - 2,
    "[PAD]": KIMI_NUM_RESERVED - 1,
}
_KIMI_CODE_STUB = (
    '"""Stands in for Kimi\'s tokenization_kimi.py: the engine must never run checkpoint code."""\n\n'
    'raise RuntimeError("tokenization_kimi.py was executed")\n'
)


def train_byte_bpe(
    vocab_size: int, pattern: str | None = None, special_tokens=(), corpus=FAMILY_CORPUS
) -> Tokenizer:
    """A byte-level BPE trained on corpus; `pattern` splits text first (else ByteLevel's own regex)."""
    tok = Tokenizer(models.BPE())
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def save_bpe_tokenizer(directory: Path, vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a tiny corpus, with ChatML specials."""
    tok = train_byte_bpe(
        vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], corpus=CORPUS
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(str(directory))
    return fast


def save_glm_tokenizer(directory: Path, vocab_size: int | None = None) -> PreTrainedTokenizerFast:
    """GLM-4.5's tokenizer form; `vocab_size` is the model's (checked to hold every token)."""
    tok = train_byte_bpe(GLM_BPE_SIZE, GLM_PATTERN)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in GLM_SPECIAL_TOKENS]
    )
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM_TEXT_TOKENS])
    if vocab_size is not None and tok.get_vocab_size() > vocab_size:
        raise ValueError(f"GLM tokenizer has {tok.get_vocab_size()} tokens; model has {vocab_size}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.chat_template = GLM45_TEMPLATE
    fast.save_pretrained(str(directory))
    return fast


def glm_token_id(token: str) -> int:
    """Id of a GLM added token in save_glm_tokenizer's vocabulary (they follow the BPE ids)."""
    return GLM_BPE_SIZE + (GLM_SPECIAL_TOKENS + GLM_TEXT_TOKENS).index(token)


def kimi_ranks(num_ranks: int = KIMI_NUM_RANKS) -> dict[bytes, int]:
    """Ranks for a tiktoken BPE: the 256 bytes, then trained merges in merge order.

    A merge's rank is its priority, which is how tiktoken reproduces the
    trained BPE: it always merges the adjacent pair whose bytes rank lowest.
    """
    tok = train_byte_bpe(num_ranks, KIMI_PATTERN)
    merges = json.loads(tok.to_str())["model"]["merges"]
    ranks = {bytes([b]): b for b in range(256)}
    for pair in merges:
        left, right = pair.split(" ") if isinstance(pair, str) else pair
        ranks[piece_to_bytes(left) + piece_to_bytes(right)] = len(ranks)
    if len(ranks) != num_ranks:
        raise ValueError(f"the corpus gave {len(ranks)} ranks, not {num_ranks}")
    return ranks


def kimi_token_id(token: str) -> int:
    """Id of a Kimi special token in save_kimi_tokenizer's default layout."""
    return KIMI_NUM_RANKS + KIMI_SPECIAL_OFFSETS[token]


def save_kimi_tokenizer(
    directory: Path,
    vocab_size: int | None = None,
    num_ranks: int = KIMI_NUM_RANKS,
    num_reserved: int = KIMI_NUM_RESERVED,
) -> KimiTokenizer:
    """Kimi K2's tokenizer form; `vocab_size` is the model's (checked to hold every token)."""
    if vocab_size is not None and num_ranks + num_reserved > vocab_size:
        raise ValueError(
            f"Kimi tokenizer has {num_ranks + num_reserved} ids; model has {vocab_size}"
        )
    directory.mkdir(parents=True, exist_ok=True)
    write_ranks(directory / RANKS_FILE, kimi_ranks(num_ranks))
    offsets = {**KIMI_SPECIAL_OFFSETS, "[UNK]": num_reserved - 2, "[PAD]": num_reserved - 1}
    names = {offset: token for token, offset in offsets.items()}
    decoder = {
        str(num_ranks + offset): {
            "content": names.get(offset, f"<|reserved_token_{num_ranks + offset}|>"),
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for offset in range(num_reserved)
    }
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [
            t for t in offsets if t not in ("[BOS]", "[EOS]", "[UNK]", "[PAD]")
        ],
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1000000000000000019884624838656,
        "tokenizer_class": "TikTokenTokenizer",
        "chat_template": KIMI_K2_TEMPLATE,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (directory / "tokenization_kimi.py").write_text(_KIMI_CODE_STUB)
    return KimiTokenizer.from_pretrained(directory)
