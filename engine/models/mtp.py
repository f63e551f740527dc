"""Multi-token prediction (MTP) layers, the speculative draft that DeepSeek V3 (Kimi K2.x),
DeepSeek V3.2, GLM-4.5+ and GLM-5.x checkpoints carry.

A checkpoint with `num_nextn_predict_layers` = n appends n layers after the
last decoder layer, `model.layers.{num_hidden_layers + i}.*`. Each is one
decoder layer of the model's own kind (MLA or GQA attention, the MoE MLP; for
DSA models with its own lightning indexer) behind an input stage:

    x = eh_proj([enorm(embed(t_{p+1})) ; hnorm(h_p)])     (embedding first)
    g = decoder_layer(x)                                  (the whole residual stream)
    logits = lm_head(shared_head.norm(g))                 -> a guess of t_{p+2}

where h_p is the target model's hidden state at position p after its final
norm (what vLLM and SGLang hand their MTP drafters: the model's output,
the lm_head's input). The layer runs at position p, so its KV sits at p's
slot. A chained draft feeds g back as the next h (vLLM's choice for drafting
more tokens than there are MTP layers).

Shared with the target, not loaded: the layer's own `embed_tokens` and
`shared_head.head`. The released checkpoints store copies of the target's
embedding and lm_head there (the DeepSeek V3 report: MTP modules share
them; SGLang hands the draft the target's); loading them would cost
2 x vocab x hidden per layer (3.7 GB in BF16 for DeepSeek V3) for the same
values. A checkpoint whose copies differed would only draft worse: the
verifier keeps outputs exact whatever the draft.

Checkpoint names map onto this module's (`mtp.layers.{i}.`) in
engine/weights/names.py. The MTP layer's KV is one more layer of the model's paged pool
(`grow_kv_layout`): the same page ids serve both, so the allocator, rollback
of rejected drafts, prefix caching and the host and disk tiers carry the
draft's KV with the target's, and the budget counts it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from engine.errors import UnsupportedModelError
from engine.kv.dsa_layout import DSALayout
from engine.kv.sizing import KVLayout
from engine.layers.linear import ColumnParallelLinear, RowSlice
from engine.layers.moe_routing import RoutingConfig
from engine.layers.norm import RMSNorm
from engine.model_files.model_config import ModelConfig
from engine.models.decoder import ForwardContext, PreNormDecoderLayer
from engine.models.moe_mlp import feed_forward


def mtp_layer_count(cfg: ModelConfig) -> int:
    return int(cfg.get("num_nextn_predict_layers") or 0)


class MTPLayer(nn.Module):
    def __init__(self, hidden: int, eps: float, block: PreNormDecoderLayer):
        super().__init__()
        self.enorm = RMSNorm(hidden, eps)
        self.hnorm = RMSNorm(hidden, eps)
        self.eh_proj = ColumnParallelLinear(2 * hidden, RowSlice.whole(hidden), bias=False)
        self.block = block
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(hidden, eps)

    def forward(
        self,
        embedded: torch.Tensor,
        positions: torch.Tensor,
        previous_hidden: torch.Tensor,
        ctx: ForwardContext,
    ) -> torch.Tensor:
        """The layer's output g (before shared_head.norm) for rows at `positions`, whose
        `embedded` tokens follow them and whose `previous_hidden` is h at each position."""
        # Position 0's embedding is zeroed, as vLLM's MTP layers do (SGLang's too): the
        # layer was trained on sequences shifted by one, whose first input has no token.
        embedded = embedded.masked_fill((positions == 0).unsqueeze(-1), 0)
        x = torch.cat([self.enorm(embedded), self.hnorm(previous_hidden)], dim=-1)
        return self.block(positions, self.eh_proj(x), ctx)

    def head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.shared_head.norm(hidden)


class MTPDraft(nn.Module):
    """The MTP layers of one model; draft step k uses layer k mod n (vLLM's chaining)."""

    def __init__(self, layers: list[MTPLayer], first_index: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.first_index = first_index  # the layers' index in the pool: num_hidden_layers

    def layer(self, step: int) -> MTPLayer:
        return self.layers[step % len(self.layers)]

    def grow_kv_layout(self, layout: KVLayout) -> KVLayout:
        """The target's layout plus the MTP layers, each keeping what a target layer of its
        kind keeps (a DSA MTP layer runs its own indexer, so it keeps indexer keys)."""
        count = len(self.layers)
        if layout.num_layers != self.first_index:
            raise ValueError("the MTP layers go right after the target's layers in the pool")
        grown = replace(layout, num_layers=layout.num_layers + count)
        if isinstance(layout, DSALayout):
            extra = tuple(range(self.first_index, self.first_index + count))
            grown = replace(grown, index_layers=layout.index_layers + extra)
        return grown


def _attention(
    model: nn.Module, cfg: ModelConfig, index: int, count: int
) -> tuple[nn.Module, float]:
    """The MTP layer's attention, of the target's kind, sharing its rotary tables; and the
    norm eps the family's layers use."""
    # Imported here: each family's module imports this one's callers, not the reverse.
    from engine.models.deepseek_v3 import DeepseekV3ForCausalLM, MLAAttention
    from engine.models.deepseek_v32 import DeepseekV32ForCausalLM, SparseMLAAttention
    from engine.models.dsa_config import indexer_settings
    from engine.models.glm4_moe import Glm4MoeAttention, Glm4MoeForCausalLM

    first = model.model.layers[0].self_attn  # layer 0 always runs an indexer (DSA)
    eps = cfg.get("rms_norm_eps", 1e-6)
    if isinstance(model, DeepseekV32ForCausalLM):
        # A "full" indexer of its own: the MTP layer runs alone, with no layer before it
        # in its step to share a selection from (vLLM builds one in every V3.2 layer).
        settings = indexer_settings(cfg)
        settings = replace(settings, indexer_types=settings.indexer_types + ("full",) * count)
        rotary, index_rotary = first.rotary, first.indexer.rotary
        return SparseMLAAttention(cfg, index, rotary, settings, index_rotary), eps
    if isinstance(model, DeepseekV3ForCausalLM):
        return MLAAttention(cfg, index, first.rotary), eps
    if isinstance(model, Glm4MoeForCausalLM):
        return Glm4MoeAttention(cfg, index, first.rotary), cfg.get("rms_norm_eps", 1e-5)
    raise UnsupportedModelError(
        f"{type(model).__name__} has no multi-token-prediction draft; MTP speculative "
        "decoding serves DeepSeek V3/V3.2, Kimi K2.x, GLM-4.5+ and GLM-5.x checkpoints"
    )


def build_mtp_draft(model: nn.Module, cfg: ModelConfig) -> MTPDraft:
    """The model's MTP layers (parameters as the model's are made: on meta at load)."""
    count = mtp_layer_count(cfg)
    if count <= 0:
        raise UnsupportedModelError(
            f"{cfg.architecture} checkpoint has no MTP layers (num_nextn_predict_layers is "
            "0 or absent): use --speculative prompt_lookup or none"
        )
    routing = RoutingConfig.from_config(cfg.raw) if cfg.get("n_routed_experts") else None
    layers = []
    for i in range(count):
        index = cfg.num_layers + i
        attention, eps = _attention(model, cfg, index, count)
        # The MLP of the last target layer's kind (MoE in every released model): the
        # per-layer plans (first_k_dense_replace, mlp_layer_types) stop at the last layer.
        mlp = feed_forward(cfg, cfg.num_layers - 1, routing)
        block = PreNormDecoderLayer(attention, mlp, cfg.hidden_size, eps)
        layers.append(MTPLayer(cfg.hidden_size, cfg.get("rms_norm_eps", 1e-6), block))
    return MTPDraft(layers, cfg.num_layers)
