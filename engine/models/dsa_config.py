"""What a DeepSeek-sparse-attention config says about its indexer (DeepSeek V3.2, GLM-5.x).

Read from config.json as transformers' DeepseekV32Config and GlmMoeDsaConfig
read it, defaults included:

- `index_topk` (2048): how many context positions each query attends to;
- `index_n_heads` (V3.2: 64, GLM: 32) and `index_head_dim` (128): the indexer's
  query heads and the width of its single key;
- rotary on the first `qk_rope_head_dim` dims of the indexer's q and k, with
  the attention's own frequencies: half-split (NeoX) pairs for V3.2, adjacent
  (interleaved) pairs for GLM, while the MLA attention itself is interleaved in
  both;
- GLM only, `indexer_types`: per layer "full" (runs its indexer) or "shared"
  (reuses the selection of the last full layer before it, and has no indexer
  weights and keeps no keys). A config without the list derives it like
  transformers: from `index_topk_pattern` ("F"/"S" per layer), else every
  `index_topk_freq`-th layer from `index_skip_topk_offset` on is full.

This module reads configs only; the planner and the model both take the KV
layout from `dsa_kv_layout`, so they count the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import CheckpointError
from engine.kv.dsa_layout import DSALayout
from engine.model_files.model_config import ModelConfig

GLM_MOE_DSA = "GlmMoeDsaForCausalLM"
DEEPSEEK_V32 = "DeepseekV32ForCausalLM"
DSA_ARCHITECTURES = (GLM_MOE_DSA, DEEPSEEK_V32)
# transformers' defaults for fields a config may leave out.
_INDEX_HEADS_DEFAULT = {GLM_MOE_DSA: 32, DEEPSEEK_V32: 64}
_INDEX_HEAD_DIM_DEFAULT = 128
_INDEX_TOPK_DEFAULT = 2048


@dataclass(frozen=True)
class IndexerSettings:
    topk: int
    num_heads: int
    head_dim: int
    rope_dim: int
    rope_interleaved: bool
    indexer_types: tuple[str, ...]  # "full" or "shared", one per decoder layer

    @property
    def full_layers(self) -> tuple[int, ...]:
        """The layers that run an indexer and keep indexer keys."""
        return tuple(i for i, kind in enumerate(self.indexer_types) if kind == "full")


def is_dsa_config(cfg: ModelConfig) -> bool:
    return cfg.architecture in DSA_ARCHITECTURES


def _glm_indexer_types(cfg: ModelConfig) -> list[str]:
    types = cfg.get("indexer_types")
    if types is not None:
        return list(types)
    pattern = cfg.get("index_topk_pattern")
    if pattern is not None:
        if isinstance(pattern, str):
            letters = {"F": "full", "S": "shared"}
            if set(pattern) - set(letters):
                raise CheckpointError(f"index_topk_pattern {pattern!r}: use the letters F and S")
            return [letters[c] for c in pattern]
        return list(pattern)
    freq = max(int(cfg.get("index_topk_freq", 1)), 1)
    offset = int(cfg.get("index_skip_topk_offset", 2))
    return [
        "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(cfg.num_layers)
    ]


def indexer_settings(cfg: ModelConfig) -> IndexerSettings:
    if not cfg.get("q_lora_rank"):
        raise CheckpointError(
            f"{cfg.architecture} needs q_lora_rank: its indexer reads q_a's output"
        )
    glm = cfg.architecture == GLM_MOE_DSA
    types = _glm_indexer_types(cfg) if glm else ["full"] * cfg.num_layers
    if len(types) != cfg.num_layers or set(types) - {"full", "shared"}:
        raise CheckpointError(
            f"indexer_types must give 'full' or 'shared' for each of the {cfg.num_layers} "
            f"layers; got {types}"
        )
    if types[0] != "full":
        raise CheckpointError("indexer_types: layer 0 is 'shared' but no layer before it selects")
    settings = IndexerSettings(
        topk=int(cfg.get("index_topk", _INDEX_TOPK_DEFAULT)),
        num_heads=int(cfg.get("index_n_heads", _INDEX_HEADS_DEFAULT[cfg.architecture])),
        head_dim=int(cfg.get("index_head_dim", _INDEX_HEAD_DIM_DEFAULT)),
        rope_dim=int(cfg["qk_rope_head_dim"]),
        rope_interleaved=glm,
        indexer_types=tuple(types),
    )
    if settings.topk < 1 or settings.rope_dim > settings.head_dim:
        raise CheckpointError(
            f"index_topk {settings.topk} and index_head_dim {settings.head_dim} "
            f"(which must hold the {settings.rope_dim} rope dims) do not make an indexer"
        )
    return settings


def dsa_kv_layout(cfg: ModelConfig) -> DSALayout:
    """The MLA latent row of every layer plus an indexer key for each full layer."""
    rope_dim = int(cfg["qk_rope_head_dim"])
    settings = indexer_settings(cfg)
    return DSALayout(
        num_layers=cfg.num_layers,
        kind="mla",
        latent_dim=int(cfg["kv_lora_rank"]) + rope_dim,
        rope_dim=rope_dim,
        index_dim=settings.head_dim,
        index_layers=settings.full_layers,
    )
