"""xgrammar's TokenizerInfo built from the engine's real vocabulary and stop tokens.

The grammar engine needs, for every token id the model can produce, the bytes
that token adds to the text. The engine's tokenizers come in two kinds:

- Hugging Face fast tokenizers (`tokenizer.json`: Llama, Qwen2, GLM, and the
  GGUF-converted default model). xgrammar reads these itself and works out
  whether the vocabulary is byte-level (GPT-2's alphabet), byte-fallback
  (SentencePiece `<0x0A>` pieces) or raw; we take its decoded bytes.
- Kimi's tiktoken-based tokenizer (engine/tokenizers/kimi.py), which xgrammar
  does not recognise: its pieces are byte-level strings, turned back into
  bytes here.

Special tokens are then given no text, which is how xgrammar learns that a
token can never be part of the output: otherwise `<|im_start|>` would count
as the nine characters it is written with and could be sampled inside a
JSON string (and then vanish from the detokenized text). The exceptions are
the markers a grammar itself writes (tool-call markers and `<think>` tags,
special tokens in Kimi's vocabulary) and the stop tokens, which xgrammar
only ever allows where the grammar may end. Ids past the tokenizer's
vocabulary (a padded lm_head) have no text either, so they are never allowed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import xgrammar as xgr

from engine.chat.reasoning import THINK_CLOSE, THINK_OPEN
from engine.chat.tool_text import PARSER_MARKERS
from engine.tokenizers.byte_pieces import piece_to_bytes

# Special tokens whose text grammars write (tool-call and reasoning markers).
GRAMMAR_MARKERS = frozenset(
    {THINK_OPEN, THINK_CLOSE, *(m for markers in PARSER_MARKERS.values() for m in markers)}
)


def special_token_ids(tokenizer: Any) -> set[int]:
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) or []}
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(token_id))
    return ids


def _hf_vocab(tokenizer: Any, vocab_size: int, stops: list[int]) -> tuple[list[bytes], bool]:
    # A tokenizer read back from its snapshot hands over its transformers twin.
    hf = getattr(tokenizer, "as_transformers", tokenizer)
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size, stop_token_ids=stops)
    return list(info.decoded_vocab), info.add_prefix_space


def _piece_vocab(tokenizer: Any, vocab_size: int) -> list[bytes]:
    """Bytes from byte-level pieces (Kimi's tokenizer), special tokens as their text."""
    specials = {
        int(i): str(getattr(t, "content", t))
        for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items()
    }
    size = min(vocab_size, len(tokenizer))
    pieces = tokenizer.convert_ids_to_tokens(list(range(size)))
    vocab = []
    for token_id, piece in enumerate(pieces):
        if token_id in specials:
            vocab.append(specials[token_id].encode())
            continue
        try:
            vocab.append(piece_to_bytes(piece))
        except KeyError:  # not a byte-level piece: its decoded text is what it adds
            vocab.append(tokenizer.decode([token_id]).encode())
    return vocab + [b""] * (vocab_size - size)


def build_tokenizer_info(
    tokenizer: Any, vocab_size: int, stop_token_ids: Iterable[int]
) -> xgr.TokenizerInfo:
    """TokenizerInfo over the model's `vocab_size` ids (its lm_head's width)."""
    stops = sorted({int(i) for i in stop_token_ids})
    if not stops:
        raise ValueError("a grammar needs at least one stop token to end on")
    if hasattr(tokenizer, "backend_tokenizer"):
        vocab, add_prefix_space = _hf_vocab(tokenizer, vocab_size, stops)
    else:
        vocab, add_prefix_space = _piece_vocab(tokenizer, vocab_size), False
    vocab = (vocab + [b""] * vocab_size)[:vocab_size]
    keep = set(stops)
    for token_id in special_token_ids(tokenizer):
        if token_id < vocab_size and token_id not in keep:
            if vocab[token_id].decode("utf-8", "replace") not in GRAMMAR_MARKERS:
                vocab[token_id] = b""
    return xgr.TokenizerInfo(
        vocab,
        xgr.VocabType.RAW,
        vocab_size=vocab_size,
        stop_token_ids=stops,
        add_prefix_space=add_prefix_space,
    )
