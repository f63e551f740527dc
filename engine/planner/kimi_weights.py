"""Weight groups of the Kimi Linear family that DeepSeek-style counting does not have.

engine/planner/weight_bytes.py counts every layer as MLA or GQA attention and
every MoE expert as working on the hidden size. Kimi Linear and Kimi K3 differ:

- KDA layers (the hybrid's linear-attention layers) hold q/k/v/o projections
  of linear_num_heads x linear_head_dim, a low-rank forget gate (f_a, f_b) of
  rank linear_head_dim, a per-head beta projection (b_proj), short-convolution
  kernels for q, k and v, dt_bias, A_log and the output norm; the output gate
  is low-rank (g_a, g_b) in Kimi Linear and one full-rank g_proj in K3
  (`linear_attn_config.use_full_rank_gate`);
- K3's MLA layers add an output gate g_proj (`mla_use_output_gate`);
- K3's latent MoE runs the routed experts in `routed_expert_hidden_size`
  values, between a down projection from the hidden size and an up projection
  back, with a norm (`routed_expert_down_proj` / `up_proj` / `norm`);
- K3's attention residuals add a norm and a 1 x hidden projection before
  attention and before the MLP of every layer, and one pair at the output.

The shapes are those of the released checkpoints' tensors (moonshotai/Kimi-K3:
e.g. `self_attn.f_a_proj [128, 7168]`, `self_attn.g_proj [12288, 7168]`,
`block_sparse_moe.routed_expert_down_proj [3584, 7168]`).
"""

from __future__ import annotations

from fractions import Fraction

from engine.model_files.hybrid_layers import LINEAR_ATTENTION, is_hybrid, layer_plan
from engine.model_files.model_config import ModelConfig
from engine.planner.weight_groups import WeightGroup


def kda_layer_count(cfg: ModelConfig) -> int:
    """Linear-attention (KDA) layers of a hybrid; 0 for any other model."""
    return layer_plan(cfg).count(LINEAR_ATTENTION) if is_hybrid(cfg) else 0


def kda_groups(cfg: ModelConfig, tp: int, n: int) -> list[WeightGroup]:
    """The `n` KDA layers' attention weights, sharded by heads as tensor-parallel KDA is."""
    h, heads, dim = cfg.hidden_size, cfg["linear_num_heads"], cfg["linear_head_dim"]
    width, shard, whole = heads * dim, Fraction(1, tp), Fraction(1)
    conv = cfg["linear_conv_kernel_dim"]
    groups = [
        WeightGroup("kda.q_proj+k_proj+v_proj", width, h, 3 * n, "linear", shard),
        WeightGroup("kda.o_proj", h, width, n, "linear", shard),
        WeightGroup("kda.f_a_proj", dim, h, n, "linear", whole),
        WeightGroup("kda.f_b_proj", width, dim, n, "linear", shard),
        WeightGroup("kda.b_proj", heads, h, n, "linear", shard),
        WeightGroup("kda.q/k/v_conv1d", 1, width * conv, 3 * n, "bias", shard),
        WeightGroup("kda.dt_bias+A_log", 1, width + heads, n, "bias", shard),
        WeightGroup("kda.o_norm", 1, dim, n, "norm", whole),
    ]
    if (cfg.get("linear_attn_config") or {}).get("use_full_rank_gate"):
        groups.append(WeightGroup("kda.g_proj", width, h, n, "linear", shard))
    else:
        groups += [
            WeightGroup("kda.g_a_proj", dim, h, n, "linear", whole),
            WeightGroup("kda.g_b_proj", width, dim, n, "linear", shard),
        ]
    return groups


def mla_output_gate(cfg: ModelConfig, tp: int, n: int) -> list[WeightGroup]:
    """K3's gate on the output of its `n` MLA layers, one value per head and value dim."""
    if not cfg.get("mla_use_output_gate"):
        return []
    width = cfg.num_heads * cfg["v_head_dim"]
    return [WeightGroup("mla.g_proj", width, cfg.hidden_size, n, "linear", Fraction(1, tp))]


def expert_width(cfg: ModelConfig) -> int:
    """The width routed experts work in: K3's latent, else the hidden size."""
    return int(cfg.get("routed_expert_hidden_size") or cfg.hidden_size)


def latent_moe_groups(cfg: ModelConfig, moe_layers: int) -> list[WeightGroup]:
    """The projections into and out of K3's expert latent, replicated (they feed the router's
    chosen experts on every rank), and its norm; none for a model without a latent."""
    h, latent = cfg.hidden_size, expert_width(cfg)
    if latent == h or not moe_layers:
        return []
    whole = Fraction(1)
    return [
        WeightGroup("routed_expert_down_proj", latent, h, moe_layers, "linear", whole),
        WeightGroup("routed_expert_up_proj", h, latent, moe_layers, "linear", whole),
        WeightGroup("routed_expert_norm", 1, latent, moe_layers, "norm", whole),
    ]


def attention_residual_groups(cfg: ModelConfig, layers: int) -> list[WeightGroup]:
    """K3's attention residuals: a norm and a 1 x hidden projection before attention and
    before the MLP of each layer, and one pair at the output."""
    if not cfg.get("attn_res_block_size"):
        return []
    return [WeightGroup("attn_res", 1, cfg.hidden_size, 4 * layers + 2, "norm", Fraction(1))]
