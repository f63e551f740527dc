"""A GGUF file's vocabulary rebuilt as a Hugging Face tokenizer.json.

GGUF keeps a byte-level BPE (`tokenizer.ggml.model` "gpt2") as its tokens,
their kinds, the merges, and a name for how text is split before BPE
(`tokenizer.ggml.pre`). Each split below is written the way the family's
own tokenizer.json spells it, so the folder tokenizes as the original model:

    smollm, starcoder, ...   every digit alone, then GPT-2's split
    gpt-2, ...               GPT-2's split
    llama-bpe, glm4, ...     Llama 3's split (GLM-4 and GLM-4.5 use the same one)
    qwen2                    Qwen2's split (digits one by one), after NFC
    kimi-k2                  Kimi K2's split (o200k's, plus runs of Han characters)

A name not listed is refused by name. Tokens llama.cpp marks unused (the
`[PADn]` fillers up to the embedding size) are left out of the vocabulary,
as the original tokenizer has no such tokens.
"""

from __future__ import annotations

from typing import Any

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

from engine.errors import ModelError
from engine.model_files.gguf_plan import REFETCH_HINT
from engine.tokenizers.kimi import KIMI_PATTERN

_GPT2_PRE = {"gpt-2", "phi-2", "mpt", "olmo", "roberta-bpe"}
# StarCoder-style (SmolLM's too): every digit on its own, then the GPT-2 split.
_DIGITS_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
# Llama 3's split; GLM-4 (0414) and GLM-4.5+ tokenizer.json files split the same way.
_LLAMA3_PRE = {"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3", "glm4"}
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_PRE = {"qwen2", "deepseek-r1-qwen"}
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_KIMI_PRE = {"kimi-k2"}
# llama.cpp's token kinds: 3 control (special), 4 user-defined (both matched whole in
# text, as added tokens are), 5 unused (padding the vocabulary to the embedding rows).
_CONTROL, _USER_DEFINED, _UNUSED = 3, 4, 5
# Control tokens that end a turn, which llama.cpp stops at besides the file's EOS.
END_OF_TURN_TEXTS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|endoftext|>",
    "<|end|>",
    "<end_of_turn>",
    "[EOT]",
)


def rebuild_tokenizer(
    metadata: dict[str, Any], vocab_size: int, max_positions: int
) -> tuple[Tokenizer, dict[str, Any]]:
    """The tokenizer and tokenizer_config.json of a GGUF file's vocabulary."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelError(
            f"GGUF tokenizer {kind!r} is not supported: the converter rebuilds byte-level BPE "
            "(tokenizer.ggml.model 'gpt2'). Use the original Hugging Face model folder instead."
        )
    tokens: list[str] = metadata.get("tokenizer.ggml.tokens") or []
    if not 0 < len(tokens) <= vocab_size:
        raise ModelError(
            f"GGUF has {len(tokens)} tokens for {vocab_size} embeddings; {REFETCH_HINT}."
        )
    token_types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(token_types) != len(tokens):
        raise ModelError(
            f"GGUF has {len(token_types)} token types for {len(tokens)} tokens; {REFETCH_HINT}."
        )
    vocab = {
        t: i for i, (t, kind) in enumerate(zip(tokens, token_types, strict=True)) if kind != _UNUSED
    }
    if len(vocab) != sum(kind != _UNUSED for kind in token_types):
        raise ModelError("GGUF vocabulary repeats tokens, which a BPE tokenizer cannot hold.")
    merges = [tuple(merge.split(" ")) for merge in metadata.get("tokenizer.ggml.merges", [])]
    if any(len(merge) != 2 for merge in merges):
        raise ModelError(f"GGUF tokenizer merges are malformed; {REFETCH_HINT}.")

    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    pre = metadata.get("tokenizer.ggml.pre", "gpt-2")
    if pre in _QWEN2_PRE:
        tokenizer.normalizer = normalizers.NFC()  # as Qwen2's own tokenizer.json
    tokenizer.pre_tokenizer = _pre_tokenizer(
        pre, metadata.get("tokenizer.ggml.add_space_prefix", False)
    )
    tokenizer.decoder = decoders.ByteLevel()
    # llama.cpp matches control and user-defined tokens whole in the text, as
    # added tokens do; only control tokens are special (skipped when decoding).
    added = [
        (t, k) for t, k in zip(tokens, token_types, strict=True) if k in (_CONTROL, _USER_DEFINED)
    ]
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in added if k == _CONTROL]
    )
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t, k in added if k == _USER_DEFINED])

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    add_bos = metadata.get("tokenizer.ggml.add_bos_token", False)
    add_eos = metadata.get("tokenizer.ggml.add_eos_token", False)
    tokenizer.post_processor = _post_processor(
        token("bos_token_id") if add_bos else None,
        token("eos_token_id") if add_eos else None,
        vocab,
    )
    tokenizer_config = {
        # The generic class: it takes tokenizer.json as written, while a model
        # class (GPT2Tokenizer) may rebuild parts of the pipeline itself.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos_token_id"),
        "eos_token": token("eos_token_id"),
        "pad_token": token("padding_token_id"),
        "unk_token": token("unknown_token_id"),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "model_max_length": max_positions,
        "clean_up_tokenization_spaces": False,
        "chat_template": metadata.get("tokenizer.chat_template"),
    }
    return tokenizer, tokenizer_config


def end_of_turn_ids(metadata: dict[str, Any]) -> list[int]:
    """Token ids generation stops at: EOS, the end-of-turn and end-of-message tokens the
    file names (GLM's `<|user|>`, `<|observation|>`), and control tokens that end a turn."""
    ids = [
        metadata.get(f"tokenizer.ggml.{key}")
        for key in ("eos_token_id", "eot_token_id", "eom_token_id")
    ]
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    types = metadata.get("tokenizer.ggml.token_type") or []
    ids += [
        i
        for i, (text, kind) in enumerate(zip(tokens, types, strict=False))
        if kind == _CONTROL and text in END_OF_TURN_TEXTS
    ]
    return list(dict.fromkeys(i for i in ids if isinstance(i, int)))


def _pre_tokenizer(pre: str, add_prefix_space: bool):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre in _GPT2_PRE:
        return byte_level
    if pre in _DIGITS_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    split = {
        **dict.fromkeys(_LLAMA3_PRE, _LLAMA3_SPLIT),
        **dict.fromkeys(_QWEN2_PRE, _QWEN2_SPLIT),
        **dict.fromkeys(_KIMI_PRE, KIMI_PATTERN),
    }.get(pre)
    if split is None:
        known = sorted(_GPT2_PRE | _DIGITS_PRE | _LLAMA3_PRE | _QWEN2_PRE | _KIMI_PRE)
        raise ModelError(
            f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(known)}); "
            "use the original Hugging Face model folder instead."
        )
    no_regex = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), no_regex]
    )


def _post_processor(bos: str | None, eos: str | None, vocab: dict[str, int]):
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos is None and eos is None:
        return byte_level

    def framed(piece: str, type_id: int) -> list[str]:
        return [f"{t}:{type_id}" for t in (bos, piece, eos) if t]

    template = processors.TemplateProcessing(
        single=framed("$A", 0),
        pair=framed("$A", 0) + framed("$B", 1),
        special_tokens=[(t, vocab[t]) for t in (bos, eos) if t is not None],
    )
    return processors.Sequence([byte_level, template])
