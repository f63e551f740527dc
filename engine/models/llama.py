"""Llama-family models (Llama, Qwen2, SmolLM2): GQA, NeoX rotary, SwiGLU, RMSNorm.

Their layers are the shared decoder pieces (engine/models/decoder.py) as they are.
"""

from __future__ import annotations

from engine.layers.rotary import RotaryEmbedding, model_rotary
from engine.model_files.model_config import ModelConfig
from engine.models.base import CausalLM
from engine.models.decoder import GatedMLP, GQAAttention, PreNormDecoderLayer


def llama_decoder_layer(
    cfg: ModelConfig, layer: int, qkv_bias: bool, o_bias: bool, rotary: RotaryEmbedding
) -> PreNormDecoderLayer:
    return PreNormDecoderLayer(
        GQAAttention(cfg, layer, qkv_bias, o_bias, rotary),
        GatedMLP(cfg.hidden_size, cfg["intermediate_size"], cfg.get("mlp_bias", False)),
        cfg.hidden_size,
        cfg.get("rms_norm_eps", 1e-6),
    )


class LlamaForCausalLM(CausalLM):
    supports_deterministic = True
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }
    qkv_bias_default = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        qkv_bias = cfg.get("attention_bias", self.qkv_bias_default)
        o_bias = self.o_bias(cfg)
        rotary = model_rotary(cfg, interleaved=False)
        self.build(cfg, lambda i: llama_decoder_layer(cfg, i, qkv_bias, o_bias, rotary))

    @staticmethod
    def o_bias(cfg: ModelConfig) -> bool:
        return bool(cfg.get("attention_bias", False))


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2: biases on q/k/v, none on o_proj."""

    qkv_bias_default = True

    @staticmethod
    def o_bias(cfg: ModelConfig) -> bool:
        return False
