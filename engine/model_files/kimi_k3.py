"""Kimi K3: what its config turns on beyond the Kimi Linear the engine runs, read, never guessed.

Kimi K3 (`model_type: kimi_k3`) wraps its language model in `text_config`,
which is a `kimi_linear` config (KimiLinearForCausalLM): the layer plan in
`linear_attn_config` (69 KDA and 24 MLA layers in the released 93-layer
config), MLA latent rows and KDA recurrent states sized as for Kimi Linear.
Planning needs nothing more, so `resident plan` reads K3 as it is.

Running it needs parts Kimi Linear does not have. Each is recognised by the
field the released config (moonshotai/Kimi-K3 config.json) sets for it;
transformers has no reference for any of them yet, so the engine stops with
the list rather than run a formula nobody here can check:

- attention residuals: `attn_res_block_size` (the checkpoint's
  `self_attention_res_proj` / `mlp_res_proj` / `output_attn_res_proj` weights);
- the MLA output gate: `mla_use_output_gate` (a `g_proj` on the MLA layers);
- the SiTU activation: `hidden_act: situ` with `activation_situ_beta` and
  `activation_situ_linear_beta`;
- the latent MoE: `routed_expert_hidden_size` below `hidden_size` (routed
  experts work in a narrower latent, with `routed_expert_down_proj` /
  `up_proj` / `norm` around them; `latent_moe_use_norm`);
- KDA's full-rank output gate (`linear_attn_config.use_full_rank_gate`: one
  `g_proj` instead of Kimi Linear's low-rank `g_a_proj` / `g_b_proj`) and its
  forget-gate lower bound (`linear_attn_config.gate_lower_bound`);
- MXFP4 routed experts (compressed-tensors `mxfp4-pack-quantized`), a weight
  format the engine does not read.

MLA without rotary position (`mla_use_nope: true`) is not on the list: the
engine's Kimi Linear MLA is NoPE already, as transformers' is. A Kimi-family
config asking for rotary MLA (`mla_use_nope: false`) is refused instead.
"""

from __future__ import annotations

from typing import Any

from engine.errors import UnsupportedModelError
from engine.model_files.model_config import ModelConfig

KIMI_K3 = "kimi_k3"


def _mxfp4(quantization: dict[str, Any] | None) -> bool:
    quantization = quantization or {}
    if "mxfp4" in str(quantization.get("format", "")):
        return True
    groups = (quantization.get("config_groups") or {}).values()
    return any("mxfp4" in str(group.get("format", "")) for group in groups)


def unrun_parts(cfg: ModelConfig) -> list[str]:
    """The parts this Kimi Linear / Kimi K3 config turns on that the engine does not run,
    each named with the config field that turns it on; empty when it runs them all."""
    if cfg.get("model_type") != "kimi_linear" and cfg.wrapper_model_type != KIMI_K3:
        return []
    linear = cfg.get("linear_attn_config") or {}
    parts = []
    if cfg.get("attn_res_block_size"):
        parts.append(f"attention residuals (attn_res_block_size={cfg['attn_res_block_size']})")
    if cfg.get("mla_use_output_gate"):
        parts.append("the MLA output gate (mla_use_output_gate)")
    if cfg.get("mla_use_nope") is False:
        parts.append("MLA with rotary position (mla_use_nope false; the engine runs NoPE MLA)")
    if str(cfg.get("hidden_act", "")).lower() == "situ":
        parts.append("the SiTU activation (hidden_act situ)")
    latent = cfg.get("routed_expert_hidden_size")
    if latent and int(latent) != cfg.hidden_size:
        parts.append(f"the latent MoE (routed_expert_hidden_size={latent})")
    if linear.get("use_full_rank_gate"):
        parts.append("KDA's full-rank output gate (linear_attn_config.use_full_rank_gate)")
    if linear.get("gate_lower_bound") is not None:
        parts.append(
            f"KDA's gate lower bound (linear_attn_config.gate_lower_bound="
            f"{linear['gate_lower_bound']})"
        )
    if _mxfp4(cfg.quantization):
        parts.append("MXFP4 routed experts (mxfp4-pack-quantized weights)")
    return parts


def refuse_unrun_parts(cfg: ModelConfig) -> None:
    """Stop before building a model whose config needs parts the engine does not run."""
    parts = unrun_parts(cfg)
    if not parts:
        return
    what = "Kimi K3" if cfg.wrapper_model_type == KIMI_K3 else cfg.architecture
    raise UnsupportedModelError(
        f"{what} needs parts this engine does not run yet: {'; '.join(parts)}. "
        "It runs the Kimi Linear parts (KDA and NoPE MLA layers, the sigmoid-routed MoE); "
        "`resident plan` sizes this model without running it."
    )
