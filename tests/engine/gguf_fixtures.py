"""Tiny llama GGUF files written the way llama.cpp's converter writes them.

A random transformers LlamaForCausalLM and a small byte-level BPE tokenizer
trained on the spot go into a GGUF through `gguf.GGUFWriter`, with llama.cpp's
Q/K row permutation applied, so tests can convert them back and compare.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED_TOKEN = "<think>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. The year 2024 had 366 days.",
    "def add(a, b):\n    return a + b  # the sum\n\nprint(add(12, 30))",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "Café naïve résumé, 你好世界, Россия, 😀 emoji and tabs\tand newlines\n",
    "I'm sure they'll say it's fine, don't you think? We've seen it 1,000,000 times.",
] * 20

HF_TO_GGUF_BLOCK = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
HF_TO_GGUF_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def tiny_tokenizer() -> Tokenizer:
    """A byte-level BPE with SmolLM2's pre-tokenizer: digits one by one, then GPT-2's split."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=360,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_tokens([USER_DEFINED_TOKEN])
    return tokenizer


def tiny_llama(vocab_size: int, tie_word_embeddings: bool, seed: int = 0) -> LlamaForCausalLM:
    """Hidden 64, 2 layers, 4 query heads sharing 2 KV heads; ffn 256 wide so
    that ffn_down rows hold one 256-value K-quant block."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=50000.0,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms start at exactly 1.0; vary them so a mix-up shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
    return model


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF_GLOBAL:
        return HF_TO_GGUF_GLOBAL[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{HF_TO_GGUF_BLOCK[rest.removesuffix('.weight')]}.weight"


def permute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `permute`, as it is written there."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def unpermute_rotary_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    return (
        weight.reshape(heads, weight.shape[0] // heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def encode(values: np.ndarray, qtype: GGMLQuantizationType, rng: np.random.Generator) -> np.ndarray:
    """The bytes (or array) GGUFWriter stores for `values` in `qtype`.

    gguf-py cannot quantize K-quants, so for Q4_K, Q5_K and Q6_K this returns random
    blocks with small scales instead; tests compare against their dequantization.
    """
    if qtype == GGMLQuantizationType.F32:
        return values.astype(np.float32)
    if qtype == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    block_bytes = {
        GGMLQuantizationType.Q4_K: 144,
        GGMLQuantizationType.Q5_K: 176,
        GGMLQuantizationType.Q6_K: 210,
    }
    if qtype in block_bytes:
        rows, columns = values.shape
        raw = rng.integers(0, 256, size=(rows, columns // 256, block_bytes[qtype]), dtype=np.uint8)
        if qtype == GGMLQuantizationType.Q6_K:  # d ends the block
            raw[..., 208:210] = np.array([0.0001], dtype=np.float16).view(np.uint8)
        else:  # d and dmin lead the block
            raw[..., 0:4] = np.array([0.0005, 0.0002], dtype=np.float16).view(np.uint8)
        return raw.reshape(rows, -1)
    return quants.quantize(values, qtype)


def write_tiny_gguf(
    path: Path,
    model: LlamaForCausalLM,
    tokenizer: Tokenizer,
    tensor_types: dict[str, GGMLQuantizationType] | None = None,
    architecture: str = "llama",
    tokenizer_model: str = "gpt2",
    pre: str = "smollm",
    add_bos: bool = False,
) -> dict[str, np.ndarray]:
    """Write the GGUF and return the float32 HF state dict it encodes (what a
    correct converter must give back: quantized tensors as they dequantize)."""
    tensor_types = tensor_types or {}
    config = model.config
    rng = np.random.default_rng(0)
    writer = GGUFWriter(str(path), architecture)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(0 if not tensor_types else 7)  # ALL_F32, else MOSTLY_Q8_0

    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.get)
    token_types = [
        3 if t in SPECIAL_TOKENS else 4 if t == USER_DEFINED_TOKEN else 1 for t in tokens
    ]
    merges = [" ".join(pair) for pair in _merges(tokenizer)]
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)

    expected = {}
    for hf_name, parameter in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        name = gguf_name(hf_name)
        values = parameter.detach().float().numpy()
        heads = _rotary_heads(name, config)
        if heads:
            values = permute_rotary_rows(values, heads)
        qtype = tensor_types.get(name, GGMLQuantizationType.F32)
        stored = encode(values, qtype, rng)
        raw_dtype = None if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16) else qtype
        writer.add_tensor(name, stored, raw_dtype=raw_dtype)
        decoded = quants.dequantize(stored, qtype).reshape(values.shape).astype(np.float32)
        expected[hf_name] = unpermute_rotary_rows(decoded, heads) if heads else decoded

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return expected


def write_tiny_block_gguf(path: Path) -> Path:
    """A tiny Llama whose layers the grid kernel packs from the file's blocks as they are:
    Q4_1 layers, a Q8_0 head and embedding."""
    tokenizer = tiny_tokenizer()
    model = tiny_llama(tokenizer.get_vocab_size(), tie_word_embeddings=False)
    names = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    types = {
        f"blk.{i}.{name}.weight": GGMLQuantizationType.Q4_1
        for i in range(model.config.num_hidden_layers)
        for name in names
    }
    types.update(
        {"output.weight": GGMLQuantizationType.Q8_0, "token_embd.weight": GGMLQuantizationType.Q8_0}
    )
    write_tiny_gguf(path, model, tokenizer, types)
    return path


def _rotary_heads(name: str, config: LlamaConfig) -> int:
    if ".attn_q." in name:
        return config.num_attention_heads
    if ".attn_k." in name:
        return config.num_key_value_heads
    return 0


def _merges(tokenizer: Tokenizer) -> list[tuple[str, str]]:
    import json

    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    # tokenizers writes merges as pairs (newer) or as "a b" strings (older).
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]
