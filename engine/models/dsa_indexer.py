"""The lightning indexer of DeepSeek sparse attention (DeepSeek V3.2, GLM-5.x): its
weights, its keys in the cache, and the top-k choice it makes for one step.

Per token (checkpoint names under `self_attn.indexer.`):
- queries: `wq_b` on the attention's normalised q_a output (q_lora_rank wide)
  -> index_n_heads heads of index_head_dim;
- one key: `wk` on the layer's input -> `k_norm` (a LayerNorm, with bias);
- head weights: `weights_proj` on the layer's input, times index_n_heads^-0.5,
  kept in float32 as transformers keeps it (`_keep_in_fp32_modules`);
- rotary on the first qk_rope_head_dim dims of queries and key, with the
  attention's frequencies (the style per family: engine/models/dsa_config.py).
The key goes to the pool's indexer region (engine/kv/dsa_pool.py); scores and
the top-k are engine/attention/sparse_mla.py's. The indexer is replicated on
every tensor-parallel rank, like the latent path, so every rank selects alike.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.metadata import AttentionMetadata
from engine.attention.sparse_mla import (
    Selection,
    needs_selection,
    paged_decode_selection,
    select_top_k,
    step_groups,
)
from engine.layers.linear import ColumnParallelLinear, RowSlice
from engine.layers.rotary import RotaryEmbedding
from engine.model_files.model_config import ModelConfig
from engine.models.dsa_config import IndexerSettings

# Where a step's selections wait for the "shared" layers after a full one (GLM-5).
SELECTIONS_KEY = "dsa.selections"


class LightningIndexer(nn.Module):
    def __init__(
        self, cfg: ModelConfig, layer: int, settings: IndexerSettings, rotary: RotaryEmbedding
    ):
        super().__init__()
        self.layer = layer
        self.settings = settings
        heads, width = settings.num_heads, settings.head_dim
        self.wq_b = ColumnParallelLinear(
            cfg["q_lora_rank"], RowSlice.whole(heads * width), bias=False
        )
        self.wk = ColumnParallelLinear(cfg.hidden_size, RowSlice.whole(width), bias=False)
        self.k_norm = nn.LayerNorm(width, eps=1e-6)
        self.weights_proj = ColumnParallelLinear(cfg.hidden_size, RowSlice.whole(heads), bias=False)
        # Kept float32 and dense: it weighs the heads of a ranking, as the MoE router does.
        self.weights_proj.keeps_dense = True
        self.rotary = rotary
        self.scale = width**-0.5
        self.head_weight = heads**-0.5

    def select(
        self,
        positions: torch.Tensor,
        x: torch.Tensor,
        q_resid: torch.Tensor,
        ctx,
    ) -> list[Selection | None]:
        """Write this step's indexer keys and choose each group's positions (None where
        a group sees no more than topk positions, so attends to all of them)."""
        keys = self.k_norm(self.wk(x)).unsqueeze(1)  # [T, 1, D]: one key head
        self.rotary(positions, keys, ctx.step_cache)
        meta: AttentionMetadata = ctx.meta
        ctx.pool.write_index_keys(self.layer, keys.squeeze(1), meta.slot_mapping)
        groups = step_groups(meta)
        topk = self.settings.topk
        if not any(needs_selection(part, topk) for _, part in groups):
            return [None] * len(groups)
        heads, width = self.settings.num_heads, self.settings.head_dim
        queries = self.wq_b(q_resid).view(-1, heads, width)
        self.rotary(positions, queries, ctx.step_cache)
        weights = self.weights_proj(x.float()) * self.head_weight  # [T, H] float32
        selections: list[Selection | None] = []
        for tokens, part in groups:
            if not needs_selection(part, topk):
                selections.append(None)
                continue
            q, w = (queries, weights) if tokens is None else (queries[tokens], weights[tokens])
            q, w = q[part.query_index], w[part.query_index]
            args = (self.layer, q, w, ctx.pool, part, topk, self.scale, ctx.backend)
            chosen = paged_decode_selection(*args)  # the Triton backend's, for decode
            if chosen is None:
                context_keys = ctx.pool.gather_index_keys(self.layer, part.context_slots)
                chosen = select_top_k(q, w, context_keys, part, topk, self.scale)
            selections.append(chosen)
        return selections
