"""What a GGUF file of each family the engine serves holds, as a Hugging Face model.

Per GGUF architecture (`general.architecture`): which config.json the metadata
makes (for the engine's model class and transformers' alike) and the tensor
plan (gguf_plan.py) that rebuilds every Hugging Face tensor from GGUF rows.

    llama      LlamaForCausalLM (Llama, SmolLM2, Mistral dense)
    qwen2      Qwen2ForCausalLM
    glm4       Glm4ForCausalLM (GLM-4-0414 dense)
    glm4moe    Glm4MoeForCausalLM (GLM-4.5, 4.6, 4.7)       -> gguf_moe.py
    deepseek2  DeepseekV3ForCausalLM (Kimi K2.x, DeepSeek V3) -> gguf_moe.py

Names follow llama.cpp's (gguf-py `constants.py`): `blk.N.attn_q.weight` and
so on. A tensor the plan has no place for is refused by name rather than
dropped; only multi-token-prediction layers (blocks past the last decoder
layer) are left out on purpose, and said so in the log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ModelError
from engine.model_files.gguf_plan import (
    ORIGINAL_FOLDER,
    REFETCH_HINT,
    Piece,
    Planner,
    TensorPlan,
    rotary_unpermuted,
    row_view_shape,
)
from engine.model_files.gguf_tokenizer import end_of_turn_ids

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "glm4", "glm4moe", "deepseek2")


@dataclass(frozen=True)
class GGUFModel:
    """A GGUF file read as a Hugging Face model: config.json and the tensor plan."""

    architecture: str  # general.architecture
    config: dict[str, Any]
    plans: tuple[TensorPlan, ...]  # in the file order of their first source
    skipped: tuple[str, ...]  # GGUF tensors left out on purpose (multi-token prediction)


class Metadata:
    """The GGUF key-value pairs; `get`/`number` read `{architecture}.{key}`."""

    def __init__(self, values: dict[str, Any]):
        self.values = values
        self.architecture = values.get("general.architecture")

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(f"{self.architecture}.{key}", default)

    def number(self, key: str, default: Any = None) -> Any:
        """A number the file must hold (or `default`); one value per layer must agree."""
        value = self.get(key, default)
        if isinstance(value, list) and value and all(v == value[0] for v in value):
            value = value[0]
        if isinstance(value, list):
            raise ModelError(
                f"GGUF metadata {self.architecture}.{key} differs between layers ({value[:4]}...), "
                f"which the engine's {self.architecture} models do not support; {ORIGINAL_FOLDER}."
            )
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ModelError(
                f"GGUF metadata lacks {self.architecture}.{key} as a number; {REFETCH_HINT}."
            )
        return value


# --- config pieces every family shares ------------------------------------------


def num_layers(meta: Metadata) -> int:
    """Decoder layers: block_count less the multi-token-prediction blocks after them."""
    return meta.number("block_count") - int(meta.get("nextn_predict_layers") or 0)


def planner(meta: Metadata, shapes: dict[str, tuple[int, ...]]) -> Planner:
    return Planner(shapes, num_layers(meta), int(meta.get("nextn_predict_layers") or 0))


def vocab_size(shapes: dict[str, tuple[int, ...]]) -> int:
    return int(shapes["token_embd.weight"][0])


def rope_config(meta: Metadata, partial: float | None = None) -> dict[str, Any]:
    """rope_theta, rope_parameters (transformers 5) and rope_scaling (older readers)."""
    theta = meta.get("rope.freq_base", 10000.0)
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    scaling = meta.get("rope.scaling.type", "none")
    if scaling == "linear":
        params.update(rope_type="linear", factor=meta.number("rope.scaling.factor"))
    elif scaling == "yarn":
        params.update(
            rope_type="yarn",
            factor=meta.number("rope.scaling.factor"),
            original_max_position_embeddings=meta.number("rope.scaling.original_context_length"),
        )
        for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if meta.get(f"rope.scaling.{key}") is not None:
                params[name] = meta.get(f"rope.scaling.{key}")
    elif scaling != "none":
        raise ModelError(f"RoPE scaling {scaling!r} is not supported; {ORIGINAL_FOLDER}.")
    if partial is not None:
        params["partial_rotary_factor"] = partial
    fields = {
        "rope_theta": theta,
        "rope_parameters": params,
        "rope_scaling": None if scaling == "none" else params,
    }
    if partial is not None:
        fields["partial_rotary_factor"] = partial
    return fields


def special_ids(meta: Metadata) -> dict[str, Any]:
    return {
        "bos_token_id": meta.values.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.values.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.values.get("tokenizer.ggml.padding_token_id"),
    }


def dtype_fields(meta: Metadata) -> dict[str, str]:
    # An all-float32 file says nothing about training; anything else computes in bfloat16.
    dtype = "float32" if meta.values.get("general.file_type") == 0 else "bfloat16"
    return {"torch_dtype": dtype, "dtype": dtype}


def common_config(meta: Metadata, shapes, architecture: str, model_type: str) -> dict[str, Any]:
    """The fields of every family but llama (whose config.json stays as it always was,
    down to stopping at EOS alone): generation stops at every end-of-turn token the
    vocabulary marks, as llama.cpp does (GLM's <|user|> and <|observation|>, ...)."""
    heads = meta.number("attention.head_count")
    stops = end_of_turn_ids(meta.values)
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size(shapes),
        "hidden_size": meta.number("embedding_length"),
        "intermediate_size": meta.number("feed_forward_length"),
        "num_hidden_layers": num_layers(meta),
        "num_attention_heads": heads,
        "num_key_value_heads": meta.number("attention.head_count_kv", heads),
        "hidden_act": "silu",
        "max_position_embeddings": meta.number("context_length"),
        "rms_norm_eps": meta.get("attention.layer_norm_rms_epsilon", 1e-6),
        "tie_word_embeddings": "output.weight" not in shapes,
        "num_nextn_predict_layers": 0,  # the folder holds none (see Planner.finish)
        **special_ids(meta),
        **({"eos_token_id": stops[0] if len(stops) == 1 else stops} if stops else {}),
        **dtype_fields(meta),
    }


# --- tensors every family shares --------------------------------------------------


def plan_globals(p: Planner) -> None:
    p.rows("model.embed_tokens.weight", "token_embd.weight")
    p.rows("model.norm.weight", "output_norm.weight")
    p.optional("lm_head.weight", "output.weight")


def plan_gqa_attention(
    p: Planner, layer: int, heads: int, kv_heads: int, head_dim: int, unpermute: bool = False
) -> bool:
    """q/k/v projections (and biases, when the file has them) from attn_q/attn_k/attn_v or
    a fused attn_qkv; `unpermute` undoes llama.cpp's Q/K row order. Returns whether
    the projections have biases."""
    block, prefix = f"blk.{layer}", f"model.layers.{layer}.self_attn"
    sizes = {"q": heads * head_dim, "k": kv_heads * head_dim, "v": kv_heads * head_dim}
    rotary_heads = {"q": heads, "k": kv_heads, "v": 0} if unpermute else {}
    has_bias = False
    for suffix in ("weight", "bias"):
        fused = f"{block}.attn_qkv.{suffix}"
        if p.has(fused):
            total, _ = row_view_shape(p.require(fused))
            if total != sum(sizes.values()):
                raise ModelError(f"GGUF tensor {fused} has {total} rows, not {sum(sizes.values())}")
        start = 0
        for part, size in sizes.items():
            source = fused if p.has(fused) else f"{block}.attn_{part}.{suffix}"
            if suffix == "bias" and not p.has(source):
                continue
            has_bias |= suffix == "bias"
            heads_here = rotary_heads.get(part, 0)
            offset = start if source == fused else 0
            rows = (
                rotary_unpermuted(size, heads_here, offset)
                if heads_here
                else range(offset, offset + size)
            )
            p.rows(f"{prefix}.{part}_proj.{suffix}", source, rows)
            start += size
    p.rows(f"{prefix}.o_proj.weight", f"{block}.attn_output.weight")
    return has_bias


def plan_dense_mlp(p: Planner, layer: int) -> None:
    block, prefix = f"blk.{layer}", f"model.layers.{layer}.mlp"
    for part in ("gate", "up", "down"):
        p.rows(f"{prefix}.{part}_proj.weight", f"{block}.ffn_{part}.weight")


# --- llama, qwen2, glm4 ----------------------------------------------------------


def plan_llama(meta: Metadata, shapes) -> GGUFModel:
    """Llama as the converter has always written it (the default model's config.json)."""
    hidden_size = meta.number("embedding_length")
    heads = meta.number("attention.head_count")
    kv_heads = meta.get("attention.head_count_kv", heads)
    head_dim = meta.get("attention.key_length", hidden_size // heads)
    rotary_dim = meta.get("rope.dimension_count", head_dim)
    if rotary_dim != head_dim:
        raise ModelError(
            f"Partial rotary embeddings ({rotary_dim} of {head_dim}) are not supported."
        )
    layers = meta.number("block_count")
    p = Planner(shapes, layers)
    plan_globals(p)
    bias = False
    for i in range(layers):
        p.rows(f"model.layers.{i}.input_layernorm.weight", f"blk.{i}.attn_norm.weight")
        p.rows(f"model.layers.{i}.post_attention_layernorm.weight", f"blk.{i}.ffn_norm.weight")
        bias |= plan_gqa_attention(p, i, heads, kv_heads, head_dim, unpermute=True)
        plan_dense_mlp(p, i)
    rope = rope_config(meta)
    if rope["rope_parameters"]["rope_type"] not in ("default", "linear"):
        raise ModelError(
            f"RoPE scaling {rope['rope_parameters']['rope_type']!r} is not supported; "
            f"{ORIGINAL_FOLDER}."
        )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size(shapes),
        "hidden_size": hidden_size,
        "intermediate_size": meta.number("feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": meta.number("context_length"),
        "rms_norm_eps": meta.get("attention.layer_norm_rms_epsilon", 1e-5),
        # Both spellings: transformers 5 reads rope_parameters, older readers rope_theta.
        **rope,
        "attention_bias": bias,
        "mlp_bias": False,
        "tie_word_embeddings": "output.weight" not in shapes,
        **special_ids(meta),
        **dtype_fields(meta),
    }
    plans, skipped = p.finish("llama")
    return GGUFModel("llama", config, plans, skipped)


def plan_dense(meta: Metadata, shapes) -> GGUFModel:
    """Qwen2 and GLM-4 dense: GQA with q/k/v biases, rotary as stored (no Q/K row order)."""
    glm = meta.architecture == "glm4"
    architecture, model_type = ("Glm4ForCausalLM", "glm4") if glm else ("Qwen2ForCausalLM", "qwen2")
    config = common_config(meta, shapes, architecture, model_type)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = meta.number("attention.key_length", config["hidden_size"] // heads)
    rotary_dim = meta.number("rope.dimension_count", head_dim)
    if not glm and rotary_dim != head_dim:
        raise ModelError(f"Partial rotary embeddings ({rotary_dim} of {head_dim}) in a qwen2 file.")
    config.update(head_dim=head_dim, **rope_config(meta, rotary_dim / head_dim if glm else None))
    layers = config["num_hidden_layers"]
    p = planner(meta, shapes)
    plan_globals(p)
    bias = True
    for i in range(layers):
        prefix, block = f"model.layers.{i}", f"blk.{i}"
        p.rows(f"{prefix}.input_layernorm.weight", f"{block}.attn_norm.weight")
        p.rows(f"{prefix}.post_attention_layernorm.weight", f"{block}.ffn_norm.weight")
        bias &= plan_gqa_attention(p, i, heads, kv_heads, head_dim)
        if not glm:
            plan_dense_mlp(p, i)
            continue
        p.rows(f"{prefix}.post_self_attn_layernorm.weight", f"{block}.post_attention_norm.weight")
        p.rows(f"{prefix}.post_mlp_layernorm.weight", f"{block}.post_ffw_norm.weight")
        p.rows(f"{prefix}.mlp.down_proj.weight", f"{block}.ffn_down.weight")
        # GLM-4 keeps gate and up as one matrix [gate | up]; llama.cpp stores it as ffn_up
        # (or, split, as ffn_gate and ffn_up: their rows one after the other).
        gate, up = f"{block}.ffn_gate.weight", f"{block}.ffn_up.weight"
        if p.has(gate):
            (gate_rows, columns), (up_rows, _) = p.require(gate), p.require(up)
            pieces = (Piece(gate, range(gate_rows)), Piece(up, range(up_rows)))
            p.add(f"{prefix}.mlp.gate_up_proj.weight", (gate_rows + up_rows, columns), pieces)
        else:
            p.rows(f"{prefix}.mlp.gate_up_proj.weight", up)
    if not bias:
        raise ModelError(
            f"This {meta.architecture} GGUF lacks the q/k/v biases {architecture} has; "
            f"the file is not plain {meta.architecture}."
        )
    config["attention_bias"] = True
    plans, skipped = p.finish(meta.architecture)
    return GGUFModel(meta.architecture, config, plans, skipped)
