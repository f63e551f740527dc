"""DeepSeek V3 as Kimi K2, K2-Instruct-0905, K2-Thinking, K2.5 and K2.6 use it (DeepseekV3ForCausalLM).

Attention is MLA (multi-head latent attention):
- queries: `q_a_proj` -> `q_a_layernorm` -> `q_b_proj` (low-rank, q_lora_rank),
  or one `q_proj` when the config has no q_lora_rank; per head
  [nope (qk_nope_head_dim) | rope (qk_rope_head_dim)];
- keys and values: `kv_a_proj_with_mqa` gives [latent (kv_lora_rank) |
  k_rope (qk_rope_head_dim)] per token; the latent is normalised by
  `kv_a_layernorm` and cached together with the rotated k_rope (the latent
  pool), and `kv_b_proj` turns it into per-head k_nope and v.
Head sizes come from qk_nope/qk_rope/v_head_dim only: the `head_dim` that
transformers writes into the config is the rope width, not a head size.

Rotary: interleaved pairs on the rope dims (`rope_interleave`, default true,
as the original DeepSeek code), YaRN scaled, and DeepSeek's mscale multiplies
the softmax scale (engine.layers.yarn). q_a_proj and kv_a_proj_with_mqa read
the same input, so they run as one fused matrix.

Tensor parallel: the heads split over the ranks (q_b_proj / q_proj and
kv_b_proj by output rows, o_proj by input columns, one all-reduce), while
the latent path (q_a/kv_a, its norms) is replicated, so every rank caches
the whole latent row of each token; docs/DISTRIBUTED.md gives the numbers
behind that choice.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from engine.attention.mla import PATHS, MLADims, mla_attention
from engine.collectives import parallel
from engine.cpu_kernels.mla_decode import LatentGrid
from engine.kv.mla_pool import MLALayout
from engine.kv.rotation import HadamardRotation, rotate_input_columns
from engine.layers.linear import ColumnParallelLinear, FusedLinear, RowParallelLinear, RowSlice
from engine.layers.moe import ROUTER_FP32_SUFFIXES
from engine.layers.moe_routing import RoutingConfig
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, rope_inv_freq
from engine.layers.yarn import softmax_scale_multiplier
from engine.model_files.model_config import ModelConfig
from engine.models.base import CausalLM
from engine.models.decoder import ForwardContext, PreNormDecoderLayer
from engine.models.moe_mlp import feed_forward, moe_packed_modules

# The q_a and kv_a norms take the RMSNorm default, not the config's rms_norm_eps: so
# DeepSeek's code and transformers build them (GLM-5 says rms_norm_eps 1e-5).
LATENT_NORM_EPS = 1e-6


def mla_dims(cfg: ModelConfig) -> MLADims:
    return MLADims(
        num_heads=cfg.num_heads,
        nope_dim=cfg["qk_nope_head_dim"],
        rope_dim=cfg["qk_rope_head_dim"],
        v_dim=cfg["v_head_dim"],
        lora_rank=cfg["kv_lora_rank"],
    )


def mla_kv_layout(cfg: ModelConfig) -> MLALayout:
    """One latent row per token per layer: kv_lora_rank + qk_rope_head_dim (576 for Kimi)."""
    dims = mla_dims(cfg)
    return MLALayout(
        num_layers=cfg.num_layers,
        kind="mla",
        latent_dim=dims.lora_rank + dims.rope_dim,
        rope_dim=dims.rope_dim,
    )


def mla_rotary(cfg: ModelConfig) -> RotaryEmbedding:
    """One rotary table for all layers, over the rope dims only."""
    rope_dim = cfg["qk_rope_head_dim"]
    max_positions = cfg.max_position_embeddings
    inv_freq, attention_factor = rope_inv_freq(rope_dim, cfg.rope, max_positions)
    interleaved = bool(cfg.get("rope_interleave", True))
    return RotaryEmbedding(rope_dim, max_positions, inv_freq, interleaved, attention_factor)


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding):
        super().__init__()
        self.layer = layer
        full = mla_dims(cfg)
        hidden = cfg.hidden_size
        qk_head_dim = full.nope_dim + full.rope_dim
        q_rows = RowSlice.heads(full.num_heads, qk_head_dim, "attention heads")
        self.dims = dims = replace(full, num_heads=q_rows.size // qk_head_dim)
        bias = bool(cfg.get("attention_bias", False))
        self.q_lora_rank = cfg.get("q_lora_rank")
        kv_a_size = dims.lora_rank + dims.rope_dim
        if self.q_lora_rank:
            self.fused_qkv_a_proj = FusedLinear(
                hidden, {"q_a": self.q_lora_rank, "kv_a": kv_a_size}, bias=bias
            )
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(self.q_lora_rank, q_rows, bias=False)
        else:
            self.q_proj = ColumnParallelLinear(hidden, q_rows, bias=False)
            self.kv_a_proj_with_mqa = ColumnParallelLinear(
                hidden, RowSlice.whole(kv_a_size), bias=bias
            )
        self.kv_a_layernorm = RMSNorm(dims.lora_rank, LATENT_NORM_EPS)
        kv_b_rows = RowSlice.heads(full.num_heads, dims.nope_dim + dims.v_dim, "attention heads")
        self.kv_b_proj = ColumnParallelLinear(dims.lora_rank, kv_b_rows, bias=False)
        o_columns = RowSlice.heads(full.num_heads, dims.v_dim, "attention heads")
        self.o_proj = RowParallelLinear(o_columns, hidden, bias=bias)
        # Attention reads kv_b_proj's matrix (the absorbed path, and the latent
        # rotation folds into it): it stays dense. The latent projection keeps its
        # checkpoint form (packed, on a grid): the rotation of its output runs at run time.
        self.kv_b_proj.keeps_dense = True
        self.rotary = rotary
        multiplier = softmax_scale_multiplier(cfg.rope, cfg.max_position_embeddings)
        self.scale = qk_head_dim**-0.5 * multiplier
        self.path = "auto"  # "absorbed" / "expanded" force one attention path (tests, benchmarks)
        self.rope_rotation: HadamardRotation | None = None
        self.latent_rotation: HadamardRotation | None = None
        # W_UK / W_UV as a GGUF file's grid blocks, for the CPU decode kernel (set by
        # engine/models/gguf_loader.py); kv_b_proj stays dense for every other path.
        self.latent_grid: LatentGrid | None = None

    def use_latent_grid(self, grid: LatentGrid) -> None:
        """Decode steps read W_UK and W_UV from `grid` (unrotated, the gain not folded):
        set before the KV rotation is enabled, which gives it the gain and rotation."""
        if self.latent_rotation is not None:
            raise RuntimeError("the latent grid goes in before the KV rotation is enabled")
        self.latent_grid = grid

    def packed_bytes(self) -> int:
        return 0 if self.latent_grid is None else self.latent_grid.nbytes

    def enable_kv_rotation(self, batch_invariant: bool = False) -> str:
        """Hadamard-rotate the cached latent and the rope key at run time, and fold the
        latent's inverse into kv_b_proj.

        The cached latent is c = g * n(a): a the kv_a output, n the RMS
        normalisation, g the norm's gain. The gain moves into kv_b_proj's input
        columns (g -> 1), so the cache holds n(a) H, whose channels share one
        magnitude (a rotation of g * n(a) would spread the rounding of the
        large-gain channels over the small ones). kv_b_proj's input columns then
        take H (W' = W diag(g) H, and H H = I): both attention paths, the expanded
        one and the absorbed one through W_UK / W_UV (the halves of kv_b_proj),
        compute what they did. The rope key is rotated after RoPE with q's rope
        part, like GQA keys. The projections before the cache stay as loaded, so
        a checkpoint's packed grid weights stay packed; the rotation is one small
        product per token (lora_rank wide).
        """
        dims = self.dims
        if self.rope_rotation is None:
            self.latent_rotation = HadamardRotation(dims.lora_rank, batch_invariant)
            gain = self.kv_a_layernorm.weight.detach().float().clone()
            rotate_input_columns(self.kv_b_proj, 1, self.latent_rotation, column_scale=gain)
            if self.latent_grid is not None:  # the same W diag(g) H, applied at run time
                self.latent_grid.gain = gain
                self.latent_grid.block = self.latent_rotation.block
            with torch.no_grad():
                self.kv_a_layernorm.weight.fill_(1.0)
            self.rope_rotation = HadamardRotation(dims.rope_dim, batch_invariant)
        return (
            f"latent: {self.latent_rotation.describe()} (at run time, inverse in kv_b_proj); "
            f"rope key: {self.rope_rotation.describe()}"
        )

    def project(self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext):
        """What attention reads for this step's tokens: (q_nope, q_rope, latent, k_rope,
        q_resid), rotated (and Hadamard-rotated where enabled); q_resid is the normalised
        q_a output (None without q_lora_rank), which DSA's indexer also reads."""
        dims = self.dims
        q_resid = None
        if self.q_lora_rank:
            q_a, kv_a = self.fused_qkv_a_proj(x).split(
                [self.q_lora_rank, dims.lora_rank + dims.rope_dim], dim=-1
            )
            q_resid = self.q_a_layernorm(q_a)
            q = self.q_b_proj(q_resid)
        else:
            q = self.q_proj(x)
            kv_a = self.kv_a_proj_with_mqa(x)
        q = q.view(-1, dims.num_heads, dims.nope_dim + dims.rope_dim)
        q_nope, q_rope = q[..., : dims.nope_dim], q[..., dims.nope_dim :]
        latent, k_rope = kv_a.split([dims.lora_rank, dims.rope_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        if self.latent_rotation is not None:
            latent = self.latent_rotation.rotate(latent)
        k_rope = k_rope.unsqueeze(1)  # [T, 1, rope]: one rope key shared by all heads
        self.rotary(positions, q_rope, ctx.step_cache)  # in place, through the views
        self.rotary(positions, k_rope, ctx.step_cache)
        if self.rope_rotation is not None:  # after RoPE: q_rope·k_rope is unchanged
            q_rope = self.rope_rotation.rotate(q_rope)
            k_rope = self.rope_rotation.rotate(k_rope)
        return q_nope, q_rope, latent, k_rope.squeeze(1), q_resid

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        q_nope, q_rope, latent, k_rope, _ = self.project(positions, x, ctx)
        out = mla_attention(
            self.layer,
            q_nope,
            q_rope,
            latent,
            k_rope,
            self.kv_b_proj.weight,
            ctx.pool,
            ctx.meta,
            self.dims,
            self.scale,
            self.path,
            backend=ctx.backend,  # a backend with an MLA decode kernel takes decode steps
            latent_grid=self.latent_grid,
        )
        return parallel.all_reduce(self.o_proj(out.flatten(1)))


def deepseek_v3_decoder_layer(
    cfg: ModelConfig, layer: int, rotary: RotaryEmbedding, routing: RoutingConfig | None
) -> PreNormDecoderLayer:
    return PreNormDecoderLayer(
        MLAAttention(cfg, layer, rotary),
        feed_forward(cfg, layer, routing),
        cfg.hidden_size,
        cfg.get("rms_norm_eps", 1e-6),
    )


class DeepseekV3ForCausalLM(CausalLM):
    fp32_parameter_suffixes = ROUTER_FP32_SUFFIXES

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.packed_modules = dict(moe_packed_modules())
        if cfg.get("q_lora_rank"):
            self.packed_modules["q_a_proj"] = ("fused_qkv_a_proj", "q_a")
            self.packed_modules["kv_a_proj_with_mqa"] = ("fused_qkv_a_proj", "kv_a")
        routing = RoutingConfig.from_config(cfg.raw) if cfg.get("n_routed_experts") else None
        self.build(cfg, self.layer_factory(cfg, routing))

    def layer_factory(self, cfg: ModelConfig, routing: RoutingConfig | None):
        """Layer index -> decoder layer (the sparse-attention families build theirs)."""
        rotary = mla_rotary(cfg)
        return lambda i: deepseek_v3_decoder_layer(cfg, i, rotary, routing)

    def kv_layout(self) -> MLALayout:
        return mla_kv_layout(self.config)

    def set_mla_path(self, path: str) -> None:
        """Force the absorbed or expanded attention path in every layer ("auto" to choose)."""
        if path not in PATHS:
            raise ValueError(f"MLA path {path!r}: use one of {PATHS}")
        for layer in self.model.layers:
            layer.self_attn.path = path
