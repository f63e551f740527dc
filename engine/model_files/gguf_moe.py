"""The MoE families' GGUF files: GLM-4.5/4.6/4.7 (`glm4moe`) and Kimi K2.x / DeepSeek V3 (`deepseek2`).

Feed-forward (both): layers below `leading_dense_block_count` are dense
(`ffn_gate/up/down`); the others route with `ffn_gate_inp` (-> mlp.gate.weight)
and the expert bias `exp_probs_b` (-> mlp.gate.e_score_correction_bias) to the
experts llama.cpp stacks into one 3-D tensor per projection, `ffn_*_exps`
([experts, rows, columns]; expert e is a run of rows); `*_shexp` are the
shared experts (mlp.shared_experts.*). (llama.cpp fuses gate and up experts
into `ffn_gate_up_exps` for other architectures only.)

Attention, glm4moe: GQA with q/k/v biases and optional per-head q/k norms.
Attention, deepseek2: MLA. llama.cpp splits `kv_b_proj` per head into
`attn_k_b` (the key rows, stored transposed: [heads, kv_lora_rank, nope]) and
`attn_v_b` ([heads, v_head_dim, kv_lora_rank]); files written before that
split hold `attn_kv_b`, which is kv_b_proj as it is. The file says
`head_count_kv` 1 (MLA as MQA); the model has as many as query heads.

Routing: llama.cpp writes sigmoid gating as expert_gating_func 2. A deepseek2
file without the key is DeepSeek V2 to llama.cpp (softmax), a glm4moe file is
sigmoid; softmax routing (DeepSeek V2) has no model class here and is refused.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ModelError
from engine.model_files.gguf_families import (
    GGUFModel,
    Metadata,
    Planner,
    common_config,
    plan_dense_mlp,
    plan_globals,
    plan_gqa_attention,
    planner,
    rope_config,
)
from engine.model_files.gguf_plan import Piece, row_run

SIGMOID_GATING = 2
_NOT_SERVED = "use the original Hugging Face model folder of a model the engine serves"


def _routing_config(meta: Metadata, gating_default: int | None) -> dict[str, Any]:
    gating = meta.get("expert_gating_func", gating_default)
    if gating != SIGMOID_GATING:
        said = f"expert_gating_func {gating} (not sigmoid)"
        if gating is None:
            said = "no expert_gating_func (DeepSeek V2's softmax to llama.cpp)"
        raise ModelError(
            f"This {meta.architecture} GGUF routes experts by {said}; the engine serves "
            f"sigmoid-routed MoE (DeepSeek V3, Kimi K2.x, GLM-4.5+) only; {_NOT_SERVED}."
        )
    experts = meta.get("expert_count")
    if not experts:
        raise ModelError(
            f"This {meta.architecture} GGUF has no experts (expert_count); the engine serves "
            f"its MoE models only; {_NOT_SERVED}."
        )
    return {
        "moe_intermediate_size": meta.number("expert_feed_forward_length"),
        "n_routed_experts": experts,
        "num_experts_per_tok": meta.number("expert_used_count"),
        "n_shared_experts": int(meta.get("expert_shared_count") or 0),
        "first_k_dense_replace": int(meta.get("leading_dense_block_count") or 0),
        "routed_scaling_factor": meta.get("expert_weights_scale") or 1.0,
        "norm_topk_prob": bool(meta.get("expert_weights_norm", False)),
        "n_group": int(meta.get("expert_group_count") or 1),
        "topk_group": int(meta.get("expert_group_used_count") or 1),
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
    }


def _plan_feed_forward(p: Planner, layer: int, config: dict[str, Any]) -> None:
    if layer < config["first_k_dense_replace"]:
        plan_dense_mlp(p, layer)
        return
    block, prefix = f"blk.{layer}", f"model.layers.{layer}.mlp"
    hidden, size = config["hidden_size"], config["moe_intermediate_size"]
    experts = config["n_routed_experts"]
    p.rows(f"{prefix}.gate.weight", f"{block}.ffn_gate_inp.weight")
    p.rows(f"{prefix}.gate.e_score_correction_bias", f"{block}.exp_probs_b.bias")
    sources = {part: f"{block}.ffn_{part}_exps.weight" for part in ("gate", "up")}
    for source in sources.values():
        p.expect(source, (experts, size, hidden), "the stacked experts")
    down = f"{block}.ffn_down_exps.weight"
    p.expect(down, (experts, hidden, size), "the stacked experts")
    for part, source in sources.items():
        for e in range(experts):
            p.rows(f"{prefix}.experts.{e}.{part}_proj.weight", source, row_run(e * size, size))
    for e in range(experts):
        p.rows(f"{prefix}.experts.{e}.down_proj.weight", down, row_run(e * hidden, hidden))
    if config["n_shared_experts"]:
        for part in ("gate", "up", "down"):
            source = f"{block}.ffn_{part}_shexp.weight"
            p.rows(f"{prefix}.shared_experts.{part}_proj.weight", source)


def _finish(meta: Metadata, p: Planner, config: dict[str, Any]) -> GGUFModel:
    plans, skipped = p.finish(meta.architecture)
    return GGUFModel(meta.architecture, config, plans, skipped)


# --- GLM-4.5 / 4.6 / 4.7 ---------------------------------------------------------


def plan_glm4_moe(meta: Metadata, shapes) -> GGUFModel:
    config = common_config(meta, shapes, "Glm4MoeForCausalLM", "glm4_moe")
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = meta.number("attention.key_length", config["hidden_size"] // heads)
    rotary_dim = meta.number("rope.dimension_count", head_dim)
    config.update(head_dim=head_dim, **rope_config(meta, rotary_dim / head_dim))
    # llama.cpp reads a glm4moe file without expert_gating_func as sigmoid.
    config.update(_routing_config(meta, gating_default=SIGMOID_GATING))
    p = planner(meta, shapes)
    plan_globals(p)
    bias = qk_norm = True
    for i in range(config["num_hidden_layers"]):
        prefix, block = f"model.layers.{i}", f"blk.{i}"
        p.rows(f"{prefix}.input_layernorm.weight", f"{block}.attn_norm.weight")
        p.rows(f"{prefix}.post_attention_layernorm.weight", f"{block}.post_attention_norm.weight")
        bias &= plan_gqa_attention(p, i, heads, kv_heads, head_dim)
        qk_norm &= p.optional(f"{prefix}.self_attn.q_norm.weight", f"{block}.attn_q_norm.weight")
        qk_norm &= p.optional(f"{prefix}.self_attn.k_norm.weight", f"{block}.attn_k_norm.weight")
        _plan_feed_forward(p, i, config)
    config.update(attention_bias=bias, use_qk_norm=qk_norm)
    return _finish(meta, p, config)


# --- Kimi K2.x / DeepSeek V3 -----------------------------------------------------


def _deepseek_rope(meta: Metadata) -> dict[str, Any]:
    fields = rope_config(meta)
    params = fields["rope_parameters"]
    if params["rope_type"] == "yarn":
        # llama.cpp keeps mscale_all_dim as 0.1 * mscale_all_dim (yarn_log_multiplier) and
        # runs the rotary unscaled, i.e. with mscale equal to mscale_all_dim (Kimi K2 and
        # DeepSeek V3 both have 1.0).
        log_multiplier = meta.get("rope.scaling.yarn_log_multiplier")
        if log_multiplier is not None:
            mscale = float(f"{log_multiplier / 0.1:.6g}")
            params.update(mscale=mscale, mscale_all_dim=mscale)
        if meta.get("rope.scaling.attn_factor", 1.0) != 1.0:
            raise ModelError(
                "This deepseek2 GGUF scales YaRN attention by rope.scaling.attn_factor, which the "
                f"converter does not rebuild; {_NOT_SERVED}."
            )
    return fields


def plan_deepseek2(meta: Metadata, shapes) -> GGUFModel:
    config = common_config(meta, shapes, "DeepseekV3ForCausalLM", "deepseek_v3")
    heads = config["num_attention_heads"]
    rope_dim = meta.number("rope.dimension_count")
    # Files since llama.cpp split kv_b say the MLA head sizes in *_mla (key_length is then
    # the latent width); older files say them in key_length / value_length.
    qk_dim = meta.number("attention.key_length_mla", meta.get("attention.key_length"))
    v_dim = meta.number("attention.value_length_mla", meta.get("attention.value_length"))
    kv_lora = meta.number("attention.kv_lora_rank")
    q_lora = meta.get("attention.q_lora_rank") or None
    config.update(
        num_key_value_heads=heads,  # the file says 1: MLA run as MQA
        q_lora_rank=q_lora,
        kv_lora_rank=kv_lora,
        qk_rope_head_dim=rope_dim,
        head_dim=rope_dim,  # as transformers writes it: the rope width, not a head size
        qk_nope_head_dim=qk_dim - rope_dim,
        v_head_dim=v_dim,
        rope_interleave=True,  # stored as transformers has it; llama.cpp rotates pairs too
        attention_bias=False,
        **_deepseek_rope(meta),
        **_routing_config(meta, gating_default=None),
    )
    nope = qk_dim - rope_dim
    p = planner(meta, shapes)
    plan_globals(p)
    for i in range(config["num_hidden_layers"]):
        prefix, block = f"model.layers.{i}", f"blk.{i}"
        attn = f"{prefix}.self_attn"
        p.rows(f"{prefix}.input_layernorm.weight", f"{block}.attn_norm.weight")
        p.rows(f"{prefix}.post_attention_layernorm.weight", f"{block}.ffn_norm.weight")
        if q_lora:
            p.rows(f"{attn}.q_a_proj.weight", f"{block}.attn_q_a.weight")
            p.rows(f"{attn}.q_a_layernorm.weight", f"{block}.attn_q_a_norm.weight")
            p.rows(f"{attn}.q_b_proj.weight", f"{block}.attn_q_b.weight")
        else:
            p.rows(f"{attn}.q_proj.weight", f"{block}.attn_q.weight")
        p.rows(f"{attn}.kv_a_proj_with_mqa.weight", f"{block}.attn_kv_a_mqa.weight")
        p.rows(f"{attn}.kv_a_layernorm.weight", f"{block}.attn_kv_a_norm.weight")
        _plan_kv_b(p, block, f"{attn}.kv_b_proj.weight", heads, nope, v_dim, kv_lora)
        p.rows(f"{attn}.o_proj.weight", f"{block}.attn_output.weight")
        _plan_feed_forward(p, i, config)
    return _finish(meta, p, config)


def _plan_kv_b(p: Planner, block: str, name: str, heads: int, nope: int, v: int, rank: int):
    """kv_b_proj: per head, nope key rows then v value rows, each kv_lora_rank wide."""
    whole, k_b, v_b = (f"{block}.attn_{part}.weight" for part in ("kv_b", "k_b", "v_b"))
    if p.has(whole):
        p.expect(whole, (heads * (nope + v), rank), "kv_b_proj")
        p.rows(name, whole)
        p.redundant.update(source for source in (k_b, v_b) if p.has(source))
        return
    p.expect(k_b, (heads, rank, nope), "attn_k_b (kv_b_proj's keys, transposed per head)")
    p.expect(v_b, (heads, v, rank), "attn_v_b (kv_b_proj's values)")
    pieces = []
    for h in range(heads):
        # The key rows are attn_k_b's head block transposed: a dense operation.
        pieces.append(Piece(k_b, row_run(h * rank, rank), transform="transpose"))
        pieces.append(Piece(v_b, row_run(h * v, v)))
    p.add(name, (heads * (nope + v), rank), pieces)
