"""Convert a llama-architecture GGUF file into a Hugging Face model folder.

The folder holds config.json, model.safetensors (float32), tokenizer.json,
tokenizer_config.json (with the chat template), chat_template.jinja and
generation_config.json, so that both the engine's loader and transformers'
`AutoModelForCausalLM` / `AutoTokenizer` read it like any downloaded model.

Weights are dequantized and stored as float32: every GGUF block format
dequantizes to values that float32 holds exactly, while bfloat16 would round
them a second time. config.json still says bfloat16, the dtype the model was
trained in and the one to compute in.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, quants
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from tqdm import tqdm

from engine.errors import ModelError

SUPPORTED_ARCHITECTURES = ("llama",)

# llama.cpp names each tensor by block; these are the parts of a llama block.
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK_TENSOR_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight")

# `tokenizer.ggml.pre` names how llama.cpp splits text before BPE; each family
# below is rebuilt the way the original tokenizer.json spells it.
_GPT2_PRE = {"gpt-2", "phi-2", "mpt", "olmo", "roberta-bpe"}
# StarCoder-style (SmolLM's too): every digit on its own, then the GPT-2 split.
_DIGITS_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
_LLAMA3_PRE = {"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3"}
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's token types that are added tokens: 3 control (special), 4 user-defined.
_ADDED_KINDS = (3, 4)

_REFETCH_HINT = "download the file again (or run `resident models pull` for the default model)"


def convert_gguf(gguf_path: Path, out_dir: Path, progress: bool = False) -> Path:
    """Convert `gguf_path` into a model folder at `out_dir` and return `out_dir`.

    The folder is built under a temporary name next to `out_dir` and renamed
    into place at the end, so an interrupted conversion leaves nothing behind.
    An existing `out_dir` is replaced.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    reader = _open_gguf(gguf_path)
    metadata = _read_metadata(reader)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    config = _model_config(metadata, tensors)
    tokenizer, tokenizer_config = _tokenizer(metadata, config)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        building.chmod(0o755)  # mkdtemp makes it private; a model folder is an ordinary folder
        _write_weights(tensors, config, building / "model.safetensors", progress)
        tokenizer.save(str(building / "tokenizer.json"))
        _write_json(building / "config.json", config)
        _write_json(building / "tokenizer_config.json", tokenizer_config)
        _write_json(building / "generation_config.json", _generation_config(config))
        if tokenizer_config.get("chat_template"):
            (building / "chat_template.jinja").write_text(tokenizer_config["chat_template"])
        _move_into_place(building, out_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return out_dir


# --- reading -----------------------------------------------------------------


def _open_gguf(path: Path) -> GGUFReader:
    if not path.is_file():
        raise ModelError(f"GGUF file not found: {path}")
    with path.open("rb") as file:
        magic = file.read(4)
    if magic != b"GGUF":
        raise ModelError(
            f"{path} is not a GGUF file (it does not start with the GGUF magic bytes); "
            f"check the path, or {_REFETCH_HINT}."
        )
    try:
        reader = GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError, UnicodeDecodeError, struct.error) as error:
        raise ModelError(f"{path} is truncated or corrupt ({error}); {_REFETCH_HINT}.") from error
    # The reader maps tensor data lazily, so a file cut inside the last tensor
    # can still parse: check that every tensor ends inside the file.
    file_size = path.stat().st_size
    for tensor in reader.tensors:
        if tensor.data_offset + tensor.n_bytes > file_size:
            raise ModelError(
                f"{path} is truncated (tensor {tensor.name} is cut off); {_REFETCH_HINT}."
            )
    return reader


def _read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every key-value pair as plain Python values (nested arrays are skipped)."""
    metadata = {}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or not field.types:
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            if len(field.types) != 2:
                continue
            metadata[name] = [_scalar(field.parts[i], field.types[1]) for i in field.data]
        else:
            metadata[name] = _scalar(field.parts[field.data[0]], field.types[0])
    return metadata


def _scalar(part: np.ndarray, value_type: GGUFValueType) -> Any:
    if value_type == GGUFValueType.STRING:
        return part.tobytes().decode("utf-8")
    if value_type == GGUFValueType.BOOL:
        return bool(part[0])
    if value_type in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        # Through str() so that a float32 1e-05 is written as 1e-05, not 9.99e-06.
        return float(str(part[0]))
    return int(part[0])


# --- config ------------------------------------------------------------------


def _model_config(metadata: dict[str, Any], tensors: dict) -> dict[str, Any]:
    architecture = metadata.get("general.architecture")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"GGUF architecture {architecture!r} is not supported; the converter reads "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}. Use the original Hugging Face model folder instead."
        )
    if "rope_freqs.weight" in tensors:
        raise ModelError(
            "This GGUF uses Llama 3.1-style scaled RoPE (a rope_freqs tensor), which the converter "
            "does not rebuild; use the original Hugging Face model folder instead."
        )

    def required(key: str) -> int:
        value = metadata.get(f"{architecture}.{key}")
        if not isinstance(value, int):
            raise ModelError(
                f"GGUF metadata lacks {architecture}.{key} as a number; {_REFETCH_HINT}."
            )
        return value

    hidden_size = required("embedding_length")
    heads = required("attention.head_count")
    kv_heads = metadata.get(f"{architecture}.attention.head_count_kv", heads)
    head_dim = metadata.get(f"{architecture}.attention.key_length", hidden_size // heads)
    rotary_dim = metadata.get(f"{architecture}.rope.dimension_count", head_dim)
    if rotary_dim != head_dim:
        raise ModelError(
            f"Partial rotary embeddings ({rotary_dim} of {head_dim}) are not supported."
        )
    if "token_embd.weight" not in tensors:
        raise ModelError(f"GGUF has no token_embd.weight tensor; {_REFETCH_HINT}.")
    vocab_size = int(tensors["token_embd.weight"].shape[-1])
    rope_theta = metadata.get(f"{architecture}.rope.freq_base", 10000.0)
    rope_parameters: dict[str, Any] = {"rope_type": "default", "rope_theta": rope_theta}
    scaling = metadata.get(f"{architecture}.rope.scaling.type", "none")
    if scaling == "linear":
        factor = metadata[f"{architecture}.rope.scaling.factor"]
        rope_parameters.update(rope_type="linear", factor=factor)
    elif scaling != "none":
        raise ModelError(
            f"RoPE scaling {scaling!r} is not supported; use the original model folder."
        )
    # An all-float32 file says nothing about training; anything else computes in bfloat16.
    dtype = "float32" if metadata.get("general.file_type") == 0 else "bfloat16"
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": required("feed_forward_length"),
        "num_hidden_layers": required("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": required("context_length"),
        "rms_norm_eps": metadata.get(f"{architecture}.attention.layer_norm_rms_epsilon", 1e-5),
        # Both spellings: transformers 5 reads rope_parameters, older readers rope_theta.
        "rope_theta": rope_theta,
        "rope_parameters": rope_parameters,
        "rope_scaling": None if scaling == "none" else rope_parameters,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": dtype,
        "dtype": dtype,
    }


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    keys = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {key: config[key] for key in keys if config[key] is not None}


# --- weights -----------------------------------------------------------------


def _hf_tensor_name(gguf_name: str, layers: int) -> str:
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    match = _BLOCK_TENSOR_NAME.fullmatch(gguf_name)
    if match and int(match[1]) < layers and match[2] in _BLOCK_TENSORS:
        return f"model.layers.{match[1]}.{_BLOCK_TENSORS[match[2]]}.weight"
    # Refuse rather than drop: a tensor we do not map would silently change the model.
    raise ModelError(
        f"GGUF tensor {gguf_name!r} has no place in a llama model; the file is not plain llama."
    )


def _unpermute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order: it interleaves the two rotary halves of
    each head (convert_hf_to_gguf.py `permute`); transformers keeps them split."""
    rows = weight.shape[0]
    halves = weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
    return halves.swapaxes(1, 2).reshape(weight.shape)


def _dequantized(tensor, config: dict[str, Any]) -> np.ndarray:
    try:
        values = quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as error:
        raise ModelError(
            f"GGUF tensor {tensor.name} uses {GGMLQuantizationType(tensor.tensor_type).name}, "
            "which the installed gguf package cannot dequantize; upgrade gguf or use another file."
        ) from error
    values = np.ascontiguousarray(values, dtype=np.float32).reshape(
        tuple(reversed(tensor.shape.tolist()))
    )
    if ".attn_q." in tensor.name:
        values = _unpermute_rotary_rows(values, config["num_attention_heads"])
    elif ".attn_k." in tensor.name:
        values = _unpermute_rotary_rows(values, config["num_key_value_heads"])
    return values


def _write_weights(tensors: dict, config: dict[str, Any], path: Path, progress: bool) -> None:
    """Stream float32 tensors into a safetensors file, one tensor in memory at a time."""
    layers = config["num_hidden_layers"]
    names = {gguf_name: _hf_tensor_name(gguf_name, layers) for gguf_name in tensors}
    expected = set(_GLOBAL_TENSORS.values()) - (
        {"lm_head.weight"} if config["tie_word_embeddings"] else set()
    )
    expected |= {
        f"model.layers.{i}.{part}.weight" for i in range(layers) for part in _BLOCK_TENSORS.values()
    }
    if missing := sorted(expected - set(names.values())):
        raise ModelError(f"GGUF lacks tensors for {', '.join(missing[:3])}...; {_REFETCH_HINT}.")

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for gguf_name, tensor in tensors.items():
        shape = list(reversed(tensor.shape.tolist()))
        size = 4 * int(np.prod(shape))
        header[names[gguf_name]] = {
            "dtype": "F32",
            "shape": shape,
            "data_offsets": [offset, offset + size],
        }
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the format asks for 8-byte alignment

    with path.open("wb") as file:
        file.write(struct.pack("<Q", len(header_bytes)) + header_bytes)
        bar = tqdm(tensors.values(), desc="Converting", unit="tensor", disable=not progress)
        for tensor in bar:
            file.write(_dequantized(tensor, config).tobytes())


# --- tokenizer ---------------------------------------------------------------


def _tokenizer(
    metadata: dict[str, Any], config: dict[str, Any]
) -> tuple[Tokenizer, dict[str, Any]]:
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelError(
            f"GGUF tokenizer {kind!r} is not supported: the converter rebuilds byte-level BPE "
            "(tokenizer.ggml.model 'gpt2'). Use the original Hugging Face model folder instead."
        )
    tokens: list[str] = metadata.get("tokenizer.ggml.tokens") or []
    if not 0 < len(tokens) <= config["vocab_size"]:
        raise ModelError(
            f"GGUF has {len(tokens)} tokens for {config['vocab_size']} embeddings; {_REFETCH_HINT}."
        )
    vocab = {token: index for index, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ModelError("GGUF vocabulary repeats tokens, which a BPE tokenizer cannot hold.")
    merges = [tuple(merge.split(" ")) for merge in metadata.get("tokenizer.ggml.merges", [])]
    if any(len(merge) != 2 for merge in merges):
        raise ModelError(f"GGUF tokenizer merges are malformed; {_REFETCH_HINT}.")

    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(
        metadata.get("tokenizer.ggml.pre", "gpt-2"),
        metadata.get("tokenizer.ggml.add_space_prefix", False),
    )
    tokenizer.decoder = decoders.ByteLevel()
    # llama.cpp matches control and user-defined tokens whole in the text, as
    # added tokens do; only control tokens are special (skipped when decoding).
    token_types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if len(token_types) != len(tokens):
        raise ModelError(
            f"GGUF has {len(token_types)} token types for {len(tokens)} tokens; {_REFETCH_HINT}."
        )
    added = [(t, kind) for t, kind in zip(tokens, token_types, strict=True) if kind in _ADDED_KINDS]
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in added if k == 3]
    )
    tokenizer.add_tokens([AddedToken(t, normalized=False) for t, k in added if k == 4])

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
        "model_max_length": config["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "chat_template": metadata.get("tokenizer.chat_template"),
    }
    return tokenizer, tokenizer_config


def _pre_tokenizer(pre: str, add_prefix_space: bool):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    if pre in _GPT2_PRE:
        return byte_level
    if pre in _DIGITS_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _LLAMA3_PRE:
        split = pre_tokenizers.Split(Regex(_LLAMA3_SPLIT), behavior="isolated")
        no_regex = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=False)
        return pre_tokenizers.Sequence([split, no_regex])
    known = sorted(_GPT2_PRE | _DIGITS_PRE | _LLAMA3_PRE)
    raise ModelError(
        f"GGUF pre-tokenizer {pre!r} is not supported (known: {', '.join(known)}); "
        "use the original Hugging Face model folder instead."
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


# --- writing -----------------------------------------------------------------


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def _move_into_place(built: Path, out_dir: Path) -> None:
    if out_dir.exists():
        # Rename the old folder away first: a directory cannot be renamed onto a full one.
        stale = out_dir.with_name(f".{out_dir.name}.stale-{uuid.uuid4().hex[:8]}")
        out_dir.rename(stale)
        built.rename(out_dir)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        built.rename(out_dir)
