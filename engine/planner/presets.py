"""Published model shapes the planner knows by name, written as their config.json values.

Each preset is the text model's config as the checkpoint publishes it (Kimi
K2.5/K2.6 nest it under `text_config` of a `kimi_k25` wrapper, as the real
files do), so a preset goes through the same config reader as a local
config.json. `weights` is the form the checkpoint is published and served in:

- `int4`: routed experts INT4, one BF16 scale per 32 weights (compressed-tensors
  pack-quantized, group 32), everything else BF16 (Kimi K2-Thinking, K2.5, K2.6);
- `fp8`: FP8 e4m3 linear layers with one float32 scale per 128x128 block,
  embeddings, lm_head, norms and routers BF16 (Kimi K2 base/instruct);
- `bf16`: everything BF16 (the GLM reference checkpoints; GLM-4.x-FP8 variants
  exist and are a `--weights fp8` away).

Not counted: the MoonViT vision tower of K2.5/K2.6 (about 0.4B parameters,
under 1 GiB in BF16), which a text-only deployment does not need.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.planner.sparse_presets import (
    GLM5_FP8,
    GLM52_FP8,
    K3_NOT_RUN_NOTE,
    K3_VISION_NOTE,
    KIMI_K3,
    KIMI_LINEAR_48B,
)

KIMI_BASE: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "kimi_k2",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 384,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "routed_scaling_factor": 2.827,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}

KIMI_K2_FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}

KIMI_INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {
                "num_bits": 4,
                "type": "int",
                "symmetric": True,
                "strategy": "group",
                "group_size": 32,
            },
        }
    },
}


def _kimi_k25_wrapper() -> dict[str, Any]:
    """K2.5 / K2.6: the K2 text model nested in a multimodal `kimi_k25` config, 256k context."""
    text = dict(KIMI_BASE, max_position_embeddings=262144)
    text["rope_scaling"] = dict(KIMI_BASE["rope_scaling"], factor=64.0)
    text.pop("architectures")
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "quantization_config": KIMI_INT4,
    }


GLM45: dict[str, Any] = {
    "architectures": ["Glm4MoeForCausalLM"],
    "model_type": "glm4_moe",
    "vocab_size": 151552,
    "hidden_size": 5120,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 92,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "attention_bias": True,
    "use_qk_norm": True,
    "partial_rotary_factor": 0.5,
    "n_shared_experts": 1,
    "n_routed_experts": 160,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 3,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
}

GLM45_AIR = dict(
    GLM45,
    hidden_size=4096,
    intermediate_size=10944,
    moe_intermediate_size=1408,
    num_hidden_layers=46,
    n_routed_experts=128,
    first_k_dense_replace=1,
    use_qk_norm=False,
    routed_scaling_factor=1.0,
)

GLM46 = dict(GLM45, max_position_embeddings=202752)

GLM4_9B: dict[str, Any] = {
    "architectures": ["Glm4ForCausalLM"],
    "model_type": "glm4",
    "vocab_size": 151552,
    "hidden_size": 4096,
    "intermediate_size": 13696,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "attention_bias": True,
    "partial_rotary_factor": 0.5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 32768,
    "rope_theta": 10000.0,
}

SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
}


@dataclass(frozen=True)
class Preset:
    name: str
    checkpoint: str  # the Hugging Face repository the shape is taken from
    config: dict[str, Any]
    weights: str  # bf16 | fp8 | int4 | mxfp4: the published serving form
    context: int  # the context limit the model is published with
    notes: tuple[str, ...] = field(default_factory=tuple)


VISION_NOTE = "the MoonViT vision tower (~0.4B params, under 1 GiB in BF16) is not counted"

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "kimi-k2",
            "moonshotai/Kimi-K2-Instruct",
            dict(KIMI_BASE, quantization_config=KIMI_K2_FP8),
            "fp8",
            131072,
        ),
        Preset(
            "kimi-k2.5",
            "moonshotai/Kimi-K2.5",
            _kimi_k25_wrapper(),
            "int4",
            262144,
            (VISION_NOTE,),
        ),
        Preset(
            "kimi-k2.6",
            "moonshotai/Kimi-K2.6",
            _kimi_k25_wrapper(),
            "int4",
            262144,
            (VISION_NOTE,),
        ),
        Preset("glm-4.5", "zai-org/GLM-4.5", GLM45, "bf16", 131072),
        Preset("glm-4.5-air", "zai-org/GLM-4.5-Air", GLM45_AIR, "bf16", 131072),
        Preset("glm-4.6", "zai-org/GLM-4.6", GLM46, "bf16", 202752),
        Preset("glm-4.7", "zai-org/GLM-4.7", GLM46, "bf16", 202752),
        Preset("glm-4-9b", "zai-org/GLM-4-9B-0414", GLM4_9B, "bf16", 32768),
        # GLM-5.x and the Kimi hybrids: engine/planner/sparse_presets.py says where each
        # value comes from. GLM-5.x as served on 8 H200s: the FP8 checkpoints (in BF16,
        # 1.5 TB, they do not fit).
        Preset("glm-5", "zai-org/GLM-5-FP8", GLM5_FP8, "fp8", 202752),
        Preset("glm-5.1", "zai-org/GLM-5.1-FP8", GLM5_FP8, "fp8", 202752),
        Preset("glm-5.2", "zai-org/GLM-5.2-FP8", GLM52_FP8, "fp8", 1048576),
        Preset(
            "kimi-linear-48b",
            "moonshotai/Kimi-Linear-48B-A3B-Instruct",
            KIMI_LINEAR_48B,
            "bf16",
            1048576,
        ),
        Preset(
            "kimi-k3",
            "moonshotai/Kimi-K3",
            KIMI_K3,
            "mxfp4",
            1048576,
            (K3_VISION_NOTE, K3_NOT_RUN_NOTE),
        ),
        Preset("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", SMOLLM2_135M, "bf16", 8192),
    )
}
