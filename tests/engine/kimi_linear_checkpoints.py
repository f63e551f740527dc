"""Tiny Kimi Linear checkpoints made with transformers' own KimiLinear classes.

transformers saves them in the released on-disk form (`block_sparse_moe.experts.N.w1/w2/w3`,
per-projection `q_conv1d`/`k_conv1d`/`v_conv1d`, the forget gate's tensors on
`self_attn`), and its config under KimiLinearConfig's spellings
(`model_max_length`, `num_experts`, ...), so the engine reads what a real
checkpoint holds while transformers stays the reference. `as_released_config`
rewrites the config the way Moonshot's release writes it (the layer plan as
1-based `linear_attn_config` lists, first_k_dense_replace).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.devtools.testing.checkpoints import save_model

# Two KDA and two MLA layers (so each kind numbers its own pool rows), a dense first
# MLP then MoE; KDA heads of 16 (keys and values alike) with a width-4 convolution.
KIMI_LINEAR = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    num_local_experts=8,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_nope_head_dim=16,
    qk_rope_head_dim=8,
    v_head_dim=16,
    linear_head_dim=16,
    linear_num_heads=4,
    linear_conv_kernel_dim=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
    max_position_embeddings=512,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    # Larger than the default 0.02, so logits and routing margins are not all near zero.
    initializer_range=0.1,
)


def _randomize(model) -> None:
    """Norm gains and the experts' correction bias get real values (init leaves them trivial)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None:
                gate.e_score_correction_bias.normal_(0.0, 0.1)


def build_kimi_linear(directory: Path, seed: int = 0, **overrides) -> Path:
    from transformers import KimiLinearConfig, KimiLinearForCausalLM

    torch.manual_seed(seed)
    model = KimiLinearForCausalLM(KimiLinearConfig(**{**KIMI_LINEAR, **overrides})).eval()
    _randomize(model)
    return save_model(model, directory)


def as_released_config(directory: Path) -> Path:
    """Rewrite the saved config.json as Moonshot's release spells it (in place)."""
    config_file = directory / "config.json"
    raw = json.loads(config_file.read_text())
    plan = raw.pop("layer_types")
    raw.pop("mlp_layer_types")
    raw["first_k_dense_replace"] = 1
    raw["linear_attn_config"] = {
        "kda_layers": [i + 1 for i, kind in enumerate(plan) if kind == "linear_attention"],
        "full_attn_layers": [i + 1 for i, kind in enumerate(plan) if kind == "full_attention"],
        "head_dim": raw.pop("linear_head_dim"),
        "num_heads": raw.pop("linear_num_heads"),
        "short_conv_kernel_size": raw.pop("linear_conv_kernel_dim"),
    }
    config_file.write_text(json.dumps(raw, indent=2))
    return directory
