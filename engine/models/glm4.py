"""GLM-4 dense (Glm4ForCausalLM): partial interleaved rotary, extra post-attention and post-MLP norms."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, model_rotary
from engine.model_files.model_config import ModelConfig
from engine.models.base import CausalLM
from engine.models.decoder import ForwardContext, GatedMLP, GQAAttention


class Glm4DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.self_attn = GQAAttention(
            cfg, layer, qkv_bias=bool(cfg.get("attention_bias", True)), o_bias=False, rotary=rotary
        )
        self.mlp = GatedMLP(cfg.hidden_size, cfg["intermediate_size"])
        eps = cfg.get("rms_norm_eps", 1e-5)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_self_attn_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_mlp_layernorm = RMSNorm(cfg.hidden_size, eps)

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        attn = self.self_attn(positions, self.input_layernorm(x), ctx)
        x = x + self.post_self_attn_layernorm(attn)
        mlp = self.mlp(self.post_attention_layernorm(x))
        return x + self.post_mlp_layernorm(mlp)


class Glm4ForCausalLM(CausalLM):
    supports_deterministic = True
    # GLM-4 checkpoints already fuse gate and up into `gate_up_proj` as [gate | up].
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
    }

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        # Interleaved pairs over half the head unless configured (transformers' default).
        rotary = model_rotary(cfg, interleaved=True, default_partial=0.5)
        self.build(cfg, lambda i: Glm4DecoderLayer(cfg, i, rotary))

    def checkpoint_target(self, name: str) -> tuple[str, str | None]:
        if ".gate_up_proj." in name:
            return name, None
        return super().checkpoint_target(name)
