"""DeepSeek V3.2 (DeepseekV32ForCausalLM) and GLM-5.x (GlmMoeDsaForCausalLM): DeepSeek V3's
MLA and MoE with DeepSeek sparse attention (DSA).

Each attention layer is MLA as in engine/models/deepseek_v3.py (always with
q_lora_rank; its rope always interleaved), plus a lightning indexer
(engine/models/dsa_indexer.py) that picks, for every query, the `index_topk`
context positions it attends to (engine/attention/sparse_mla.py). GLM-5's
"shared" layers have no indexer: they reuse the selection of the last full
layer before them in the same step, as transformers passes `prev_topk_indices`
down the layers. The cache keeps each full layer's indexer keys beside the
latent (engine/kv/dsa_pool.py).

The MTP layer (`num_nextn_predict_layers`, checkpoint layer `num_hidden_layers`)
drafts with `--speculative mtp` (engine/models/mtp.py) and is skipped otherwise; whole decode steps in one C call (FusedMLADecode) do not
run the indexer, so these models decode layer by layer (the per-layer C MLA
decode kernel still serves decode steps, over the selected positions); CUDA
graphs are off for them (`supports_decode_graphs`), as a captured step would
fix the dense-or-sparse choice and the top-k shapes of its capture.
"""

from __future__ import annotations

import torch

from engine.attention.sparse_mla import sparse_mla_attention
from engine.collectives import parallel
from engine.errors import EngineError
from engine.kv.dsa_layout import DSALayout
from engine.layers.moe import ROUTER_FP32_SUFFIXES
from engine.layers.moe_routing import RoutingConfig
from engine.layers.rotary import RotaryEmbedding
from engine.model_files.model_config import ModelConfig
from engine.models.decoder import ForwardContext, PreNormDecoderLayer
from engine.models.deepseek_v3 import DeepseekV3ForCausalLM, MLAAttention, mla_rotary
from engine.models.dsa_config import IndexerSettings, dsa_kv_layout, indexer_settings
from engine.models.dsa_indexer import SELECTIONS_KEY, LightningIndexer
from engine.models.moe_mlp import feed_forward


class SparseMLAAttention(MLAAttention):
    """MLA whose queries attend to the positions an indexer selects (module docstring)."""

    def __init__(
        self,
        cfg: ModelConfig,
        layer: int,
        rotary: RotaryEmbedding,
        settings: IndexerSettings,
        index_rotary: RotaryEmbedding,
    ):
        super().__init__(cfg, layer, rotary)
        full = settings.indexer_types[layer] == "full"
        self.indexer = LightningIndexer(cfg, layer, settings, index_rotary) if full else None

    def forward(
        self, positions: torch.Tensor, x: torch.Tensor, ctx: ForwardContext
    ) -> torch.Tensor:
        q_nope, q_rope, latent, k_rope, q_resid = self.project(positions, x, ctx)
        if self.indexer is not None:
            selections = self.indexer.select(positions, x, q_resid, ctx)
            ctx.step_cache[SELECTIONS_KEY] = selections
        elif SELECTIONS_KEY in ctx.step_cache:
            selections = ctx.step_cache[SELECTIONS_KEY]
        else:
            raise EngineError(f"layer {self.layer} shares a selection no layer before it made")
        out = sparse_mla_attention(
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
            selections,
            self.path,
            backend=ctx.backend,
            latent_grid=self.latent_grid,
        )
        return parallel.all_reduce(self.o_proj(out.flatten(1)))


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    # The indexer's head weights stay float32, as transformers keeps them.
    fp32_parameter_suffixes = (*ROUTER_FP32_SUFFIXES, "indexer.weights_proj.weight")
    # A captured decode step would replay one dense-or-sparse choice (module docstring).
    supports_decode_graphs = False

    def layer_factory(self, cfg: ModelConfig, routing: RoutingConfig | None):
        settings = indexer_settings(cfg)
        rotary = mla_rotary(cfg)
        if not rotary.interleaved:  # both families interleave MLA's rope, whatever the config
            rotary = rotary.restyled(True)
        index_rotary = rotary.restyled(settings.rope_interleaved)

        def decoder_layer(i: int) -> PreNormDecoderLayer:
            return PreNormDecoderLayer(
                SparseMLAAttention(cfg, i, rotary, settings, index_rotary),
                feed_forward(cfg, i, routing),
                cfg.hidden_size,
                cfg.get("rms_norm_eps", 1e-6),
            )

        return decoder_layer

    def kv_layout(self) -> DSALayout:
        return dsa_kv_layout(self.config)


class GlmMoeDsaForCausalLM(DeepseekV32ForCausalLM):
    """GLM-5.x: the indexer's rope interleaved, and "shared" layers (engine/models/dsa_config.py)."""
