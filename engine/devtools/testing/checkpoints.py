"""Tiny random checkpoints of every family the engine serves, in their real on-disk forms.

Built with transformers' own model classes (the DESIGN.md §5 configs) and
saved with `save_pretrained`, so transformers can serve as the reference
implementation, then rewritten where real releases differ (see `layouts` and
`quantized`). `make_checkpoint(family, folder)` is the one-call entry:

    tiny = make_checkpoint("kimi_k2", tmp / "kimi", quantization="fp8_block")
    LLM(str(tiny.path))  # what the engine loads, in Kimi's released form
    AutoModelForCausalLM.from_pretrained(tiny.reference)  # same weights, for transformers

Families: llama, qwen2, glm4 (dense, ChatML tokenizer), glm4_moe (GLM-4.5:
GLM tokenizer.json and template), kimi_k2 and kimi_k25 (Kimi's tiktoken
tokenizer and template; sharded, `kimi_k2` config, K2.5 nesting).
Quantizations for the MoE families: fp8_block, int4_experts.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.devtools.testing.layouts import as_kimi_k2, as_kimi_k25
from engine.devtools.testing.quantized import as_fp8_block, as_int4_experts
from engine.devtools.testing.tokenizers import (
    GLM_EOS_TOKENS,
    GLM_VOCAB_SIZE,
    KIMI_VOCAB_SIZE,
    glm_token_id,
    kimi_token_id,
    save_bpe_tokenizer,
    save_glm_tokenizer,
    save_kimi_tokenizer,
)

DEEPSEEK_V3 = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=32,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    routed_scaling_factor=2.827,
    norm_topk_prob=True,
    max_position_embeddings=512,
    rope_parameters={
        "rope_type": "yarn",
        "rope_theta": 50000.0,
        "factor": 32.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    # Larger than the default 0.02, so logits and routing margins are not all near zero.
    initializer_range=0.1,
)

GLM4_MOE = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    use_qk_norm=True,
    attention_bias=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
    max_position_embeddings=512,
    initializer_range=0.1,
)

SaveTokenizer = Callable[[Path, int], object]


def save_model(
    model,
    directory: Path,
    shard_size: str | None = "200KB",
    tokenizer: SaveTokenizer = save_bpe_tokenizer,
) -> Path:
    """Save weights as safetensors (sharded when shard_size is given) plus a tokenizer."""
    directory.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": shard_size} if shard_size else {}
    model.save_pretrained(str(directory), **kwargs)
    tokenizer(directory, model.config.vocab_size)
    return directory


def _bias_qkv(model) -> None:
    # Random init leaves q/k/v biases at zero; make them matter.
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)


# The dense families share these sizes: 2 layers, hidden 64, GQA 4 query / 2 KV heads.
DENSE_SIZES = dict(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    eos_token_id=2,
)


def tiny_llama(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    params = {**DENSE_SIZES, "tie_word_embeddings": True, "bos_token_id": 0, **overrides}
    model = LlamaForCausalLM(LlamaConfig(**params)).eval()
    return save_model(model, directory)


def tiny_qwen2(
    directory: Path, seed: int = 0, *, tokenizer: SaveTokenizer = save_bpe_tokenizer, **overrides
) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    params = {**DENSE_SIZES, "tie_word_embeddings": False, **overrides}
    model = Qwen2ForCausalLM(Qwen2Config(**params)).eval()
    _bias_qkv(model)
    return save_model(model, directory, tokenizer=tokenizer)


def tiny_glm4(
    directory: Path, seed: int = 0, *, tokenizer: SaveTokenizer = save_bpe_tokenizer, **overrides
) -> Path:
    """GLM-4 dense; `tokenizer=save_glm_tokenizer` (with vocab_size=GLM_VOCAB_SIZE) gives GLM's own."""
    from transformers import Glm4Config, Glm4ForCausalLM

    torch.manual_seed(seed)
    params = {**DENSE_SIZES, "head_dim": 16, "attention_bias": True, "pad_token_id": 0}
    model = Glm4ForCausalLM(Glm4Config(**{**params, **overrides})).eval()
    _bias_qkv(model)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.post_self_attn_layernorm, layer.post_mlp_layernorm):
                norm.weight.normal_(1.0, 0.2)
    return save_model(model, directory, tokenizer=tokenizer)


def _randomize(model) -> None:
    """Give the parameters random init leaves trivial (norm gains, biases, expert bias) real values."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.5)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.normal_(0.0, 0.1)


def build_deepseek_v3(
    directory: Path, seed: int = 0, *, tokenizer: SaveTokenizer = save_bpe_tokenizer, **overrides
) -> Path:
    """DeepseekV3 as transformers saves it (deepseek_v3, rope_parameters)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**{**DEEPSEEK_V3, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory, tokenizer=tokenizer)


def build_glm4_moe(
    directory: Path, seed: int = 0, *, tokenizer: SaveTokenizer = save_bpe_tokenizer, **overrides
) -> Path:
    from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(Glm4MoeConfig(**{**GLM4_MOE, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory, tokenizer=tokenizer)


# ----- families in their released form -------------------------------------------------


@dataclass(frozen=True)
class TinyCheckpoint:
    family: str
    path: Path  # the folder in the family's released form: what the engine loads
    reference: Path  # the same (dequantized) weights in transformers' own form


QUANTIZERS = {"fp8_block": as_fp8_block, "int4_experts": as_int4_experts}
DENSE_FAMILIES = {"llama": tiny_llama, "qwen2": tiny_qwen2, "glm4": tiny_glm4}
FAMILIES = (*DENSE_FAMILIES, "glm4_moe", "kimi_k2", "kimi_k25")


def _write_generation_config(directory: Path, **fields) -> None:
    path = directory / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **fields}, indent=2))


def _build_quantized(
    build: Callable[[Path], Path], quantization: str, quantized: Path, reference: Path
) -> tuple[Path, Path]:
    """Build in a scratch folder, then write (quantized folder, dequantized reference folder)."""
    if quantization not in QUANTIZERS:
        raise ValueError(f"quantization {quantization!r}; known: {sorted(QUANTIZERS)}")
    with tempfile.TemporaryDirectory() as scratch:
        return QUANTIZERS[quantization](build(Path(scratch) / "base"), quantized, reference)


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.with_name(directory.name + suffix)


def glm4_moe_checkpoint(
    directory: Path, *, seed: int = 0, quantization: str | None = None, **overrides
) -> TinyCheckpoint:
    """GLM-4.5 (Glm4MoeForCausalLM) with GLM's tokenizer.json, template and stop tokens."""
    eos = [glm_token_id(token) for token in GLM_EOS_TOKENS]
    pad = glm_token_id("<|endoftext|>")
    params = {"vocab_size": GLM_VOCAB_SIZE, "eos_token_id": eos, "pad_token_id": pad, **overrides}

    def build(folder: Path) -> Path:
        path = build_glm4_moe(folder, seed, tokenizer=save_glm_tokenizer, **params)
        _write_generation_config(path, eos_token_id=eos, pad_token_id=pad)
        return path

    if quantization is None:
        path = build(directory)
        return TinyCheckpoint("glm4_moe", path, path)
    path, reference = _build_quantized(
        build, quantization, directory, _sibling(directory, ".reference")
    )
    return TinyCheckpoint("glm4_moe", path, reference)


def kimi_checkpoint(
    directory: Path,
    *,
    nested: bool = False,
    seed: int = 0,
    quantization: str | None = None,
    **overrides,
) -> TinyCheckpoint:
    """Kimi K2 (or K2.5 with nested=True) with Kimi's tiktoken tokenizer and chat template.

    The reference folder holds the model as deepseek_v3 (transformers cannot
    read kimi_k2 configs) with the same tokenizer files.
    """
    params = {
        "vocab_size": KIMI_VOCAB_SIZE,
        "bos_token_id": kimi_token_id("[BOS]"),
        "eos_token_id": kimi_token_id("[EOS]"),
        "pad_token_id": kimi_token_id("[PAD]"),
        **overrides,
    }

    def build(folder: Path) -> Path:
        path = build_deepseek_v3(folder, seed, tokenizer=save_kimi_tokenizer, **params)
        # Chat turns end with <|im_end|>, which is what Kimi's generation_config stops on.
        _write_generation_config(path, eos_token_id=kimi_token_id("<|im_end|>"))
        return path

    reference = _sibling(directory, ".reference")
    rewrite = as_kimi_k25 if nested else as_kimi_k2
    family = "kimi_k25" if nested else "kimi_k2"
    if quantization is None:
        return TinyCheckpoint(family, rewrite(build(reference), directory), reference)
    with tempfile.TemporaryDirectory() as scratch:
        # Quantize in transformers' layout, then rewrite that as Kimi releases it.
        quantized, _ = _build_quantized(build, quantization, Path(scratch) / "q", reference)
        return TinyCheckpoint(family, rewrite(quantized, directory), reference)


def make_checkpoint(
    family: str, directory: Path, *, seed: int = 0, quantization: str | None = None, **overrides
) -> TinyCheckpoint:
    """A tiny checkpoint of `family` (see FAMILIES) in `directory`; the reference may be a sibling."""
    if family in DENSE_FAMILIES:
        if quantization is not None:
            raise ValueError(f"{family}: quantized variants are written for the MoE families only")
        path = DENSE_FAMILIES[family](directory, seed, **overrides)
        return TinyCheckpoint(family, path, path)
    if family == "glm4_moe":
        return glm4_moe_checkpoint(directory, seed=seed, quantization=quantization, **overrides)
    if family in ("kimi_k2", "kimi_k25"):
        return kimi_checkpoint(
            directory,
            nested=family == "kimi_k25",
            seed=seed,
            quantization=quantization,
            **overrides,
        )
    raise ValueError(f"unknown family {family!r}; known: {', '.join(FAMILIES)}")
