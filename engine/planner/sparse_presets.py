"""Published shapes of the sparse-attention and hybrid families: GLM-5.x, Kimi Linear, Kimi K3.

Written as their config.json values, like engine/planner/presets.py, and read
by the same config reader. Where each value comes from:

- GLM-5 / GLM-5.1 (zai-org/GLM-5, zai-org/GLM-5.1; NVIDIA NeMo's model pages say
  5.1 keeps 5's architecture): the values xLLM reads from zai-org/GLM-5's
  config.json (jd-opensource/xllm, xllm/models/llm/glm5.h: 78 layers, hidden
  6144, 64 heads, q_lora_rank 2048, kv_lora_rank 512, qk_nope/rope/v 192/64/256,
  indexer 32 heads of 128 with top-2048, 256 experts top-8 plus one shared,
  first 3 layers dense, one MTP layer, vocab 154880, 202752 positions), the
  GLM-5 technical report's table agreeing. No indexer_types, index_topk_freq or
  pattern: every layer runs its indexer.
- GLM-5.2 (zai-org/GLM-5.2, served as zai-org/GLM-5.2-FP8 on 8xH200 in vLLM's
  recipes): the same body with 1048576 positions and shared indexers,
  index_topk_freq 4 from index_skip_topk_offset 3, so 21 of the 78 layers run
  an indexer and keep its keys (layers 0-2, then 6, 10, ..., 74; the
  checkpoint's own indexer_types list says the same). FP8 block 128x128.
- Kimi Linear 48B (moonshotai/Kimi-Linear-48B-A3B-Instruct, BF16): its
  config.json as republished with the weights requantized
  (Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4; quantization block dropped):
  27 layers, MLA at layers 4, 8, ..., 24 and 27 (1-based), KDA 32 heads of 128
  with a width-4 convolution. v_head_dim and vocab_size, cut off in that copy,
  are the family's (128, and 163840 from its pad id 163839).
- Kimi K3 (moonshotai/Kimi-K3): the released config.json's text_config (93
  layers: 69 KDA, 24 MLA; KDA 96 heads of 128; MLA latent 512 + 64; 896
  experts top-16 in a 3584-wide latent; MXFP4 experts group 32), as printed in
  a model report of the downloaded checkpoint. Its vision tower is not counted.
  The engine sizes K3 but does not run it yet (engine/model_files/kimi_k3.py).
"""

from __future__ import annotations

from typing import Any

GLM5: dict[str, Any] = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "vocab_size": 154880,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "num_nextn_predict_layers": 1,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 202752,
    "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
}

# The -FP8 checkpoints: FP8 e4m3 linear layers with one scale per 128x128 block.
GLM_FP8 = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [128, 128],
}
GLM5_FP8 = dict(GLM5, quantization_config=GLM_FP8)
GLM52_FP8 = dict(
    GLM5_FP8,
    max_position_embeddings=1048576,
    index_topk_freq=4,
    index_skip_topk_offset=3,
)


KIMI_LINEAR_48B: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 72,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [n for n in range(1, 28) if n not in (4, 8, 12, 16, 20, 24, 27)],
        "head_dim": 128,
        "num_heads": 32,
        "short_conv_kernel_size": 4,
    },
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "num_expert_group": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "model_max_length": 1048576,
}

# K3's 1-based MLA layers: every fourth from 4 to 92, and the last (93).
_K3_MLA_LAYERS = [*range(4, 93, 4), 93]

KIMI_K3_TEXT: dict[str, Any] = {
    "architectures": ["KimiLinearForCausalLM"],
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 7168,
    "intermediate_size": 33792,
    "moe_intermediate_size": 3072,
    "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": True,
    "num_hidden_layers": 93,
    "num_nextn_predict_layers": 0,
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "mla_use_nope": True,
    "mla_use_output_gate": True,
    "attn_res_block_size": 12,
    "hidden_act": "situ",
    "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0,
    "linear_attn_config": {
        "full_attn_layers": _K3_MLA_LAYERS,
        "kda_layers": [n for n in range(1, 94) if n not in _K3_MLA_LAYERS],
        "gate_lower_bound": -5.0,
        "head_dim": 128,
        "num_heads": 96,
        "short_conv_kernel_size": 4,
        "use_full_rank_gate": True,
    },
    "num_experts": 896,
    "num_experts_per_token": 16,
    "num_shared_experts": 2,
    "num_expert_group": 1,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "moe_renormalize": True,
    "moe_router_activation_func": "sigmoid",
    "routed_scaling_factor": 1.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "max_position_embeddings": 1048576,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
}

KIMI_K3: dict[str, Any] = {
    "architectures": ["KimiK3ForConditionalGeneration"],
    "model_type": "kimi_k3",
    "text_config": KIMI_K3_TEXT,
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "config_groups": {
            "group_0": {
                "format": "mxfp4-pack-quantized",
                "targets": ["Linear"],
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 32,
                    "scale_dtype": "torch.uint8",
                },
            }
        },
    },
}

K3_VISION_NOTE = "Kimi K3's vision tower and projector (under 2 GiB in BF16) are not counted"
K3_NOT_RUN_NOTE = (
    "sized from its config: the engine does not run Kimi K3 yet "
    "(attention residuals, MLA output gate, SiTU, latent MoE, MXFP4 experts)"
)
