"""Weight bytes per GPU for the planner: parameter counts from config.json, or real file sizes.

Parameters are counted matrix by matrix from the config (embeddings, attention
including MLA's q_a/q_b/kv_a/kv_b/o, dense MLPs, routed and shared experts,
routers, norms, biases, lm_head when untied, the MTP layer when the checkpoint
has one), then priced by the weight format (BF16, FP8 block, INT4 group) and
split over tensor-parallel ranks:

- sharded (each of TP ranks holds 1/TP): embeddings and lm_head (vocab-parallel),
  q/o projections, MLA's q_b/kv_b, dense MLPs, routed experts (each expert's
  intermediate dimension split, as TP MoE does) and shared experts;
- replicated on every rank: norms, routers, MLA's q_a_proj and
  kv_a_proj_with_mqa (their outputs are the shared latent), the MTP eh_proj;
- GQA k/v projections: ceil(kv_heads / TP) heads per rank, so with fewer KV
  heads than ranks each rank holds one whole head (the same rule as the KV cache).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from engine.errors import CheckpointError
from engine.model_files.model_config import ModelConfig
from engine.planner.kimi_weights import (
    attention_residual_groups,
    expert_width,
    kda_groups,
    kda_layer_count,
    latent_moe_groups,
    mla_output_gate,
)
from engine.planner.weight_groups import WeightGroup

WEIGHT_FORMATS = ("bf16", "fp8", "int4")
# Formats read from a checkpoint's quantization_config only (not offered by --weights).
INT4_FAMILY = ("int4", "mxfp4")


@dataclass(frozen=True)
class WeightScheme:
    """How weights are stored on the GPU."""

    name: str  # bf16 | fp8 | int4 | mxfp4
    block: tuple[int, int] = (128, 128)  # fp8: one float32 scale per block
    group: int | None = 32  # int4/mxfp4: one scale per `group` weights of a row; None: per row
    # int4: BF16 scales; mxfp4: one 8-bit power-of-two scale (uint8 in the checkpoint).
    scale_bytes: int = 2

    def describe(self, has_experts: bool) -> str:
        if self.name == "fp8":
            rows, cols = self.block
            return (
                f"FP8 e4m3 linear layers, one float32 scale per {rows}x{cols} block; "
                "embeddings, lm_head, norms, routers BF16"
            )
        if self.name in INT4_FAMILY:
            target = "routed experts" if has_experts else "decoder linear layers"
            group = f"group {self.group}" if self.group else "per channel"
            kind, scale = ("MXFP4", "8-bit") if self.name == "mxfp4" else ("INT4", "BF16")
            return f"{kind} {target} (one {scale} scale per {group}), everything else BF16"
        return "BF16 weights"

    def quantizes(self, group: WeightGroup, has_experts: bool) -> bool:
        if self.name == "fp8":
            return group.role in ("linear", "expert")
        if self.name in INT4_FAMILY:
            return group.role == ("expert" if has_experts else "linear")
        return False

    def group_bytes(self, group: WeightGroup, has_experts: bool) -> int:
        """Bytes of the whole group, scales included."""
        values = group.rows * group.cols
        if not self.quantizes(group, has_experts):
            return 2 * values * group.count
        if self.name == "fp8":
            rows, cols = self.block
            scales = math.ceil(group.rows / rows) * math.ceil(group.cols / cols)
            return (values + 4 * scales) * group.count
        per_row = math.ceil(group.cols / self.group) if self.group else 1
        return (values // 2 + self.scale_bytes * group.rows * per_row) * group.count


def scheme_from_config(cfg: ModelConfig) -> WeightScheme:
    """The checkpoint's own format, from its quantization_config; BF16 when it has none."""
    qc = cfg.quantization or {}
    method = qc.get("quant_method")
    if method == "fp8":
        block = qc.get("weight_block_size") or (128, 128)
        return WeightScheme("fp8", block=(int(block[0]), int(block[1])))
    if method == "compressed-tensors":
        for group in (qc.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            if weights.get("num_bits") == 4:
                size = weights.get("group_size") if weights.get("strategy") == "group" else None
                size = int(size) if size else None
                if "mxfp4" in str(group.get("format") or qc.get("format") or ""):
                    return WeightScheme("mxfp4", group=size, scale_bytes=1)
                return WeightScheme("int4", group=size)
    return WeightScheme("bf16")


def scheme_named(name: str) -> WeightScheme:
    if name == "mxfp4":  # a preset's published form (Kimi K3's experts), not a --weights choice
        return WeightScheme("mxfp4", group=32, scale_bytes=1)
    if name not in WEIGHT_FORMATS:
        raise ValueError(f"weights {name!r}: use one of {', '.join(WEIGHT_FORMATS)}")
    return WeightScheme(name)


def num_experts(cfg: ModelConfig) -> int:
    return int(
        cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    )


def mtp_layers(cfg: ModelConfig) -> int:
    return int(cfg.get("num_nextn_predict_layers") or 0)


def _is_moe_layer(cfg: ModelConfig, index: int) -> bool:
    if not num_experts(cfg):
        return False
    freq = int(cfg.get("moe_layer_freq") or 1)
    return index >= int(cfg.get("first_k_dense_replace") or 0) and index % freq == 0


def _attention(cfg: ModelConfig, tp: int, layers: int) -> list[WeightGroup]:
    """Attention weights of `layers` layers: a hybrid's KDA layers apart, the rest MLA or GQA."""
    kda = kda_layer_count(cfg)
    groups = kda_groups(cfg, tp, kda) if kda else []
    return groups + _softmax_attention(cfg, tp, layers - kda)


def _softmax_attention(cfg: ModelConfig, tp: int, n: int) -> list[WeightGroup]:
    h, heads, shard = cfg.hidden_size, cfg.num_heads, Fraction(1, tp)
    if cfg.get("kv_lora_rank"):  # MLA; the config's head_dim is the rope dim, never used here
        nope, rope = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        v_dim, kv_rank, q_rank = cfg["v_head_dim"], cfg["kv_lora_rank"], cfg.get("q_lora_rank")
        groups = []
        if q_rank:
            groups += [
                WeightGroup("q_a_proj", q_rank, h, n, "linear", Fraction(1)),
                WeightGroup("q_a_layernorm", 1, q_rank, n, "norm", Fraction(1)),
                WeightGroup("q_b_proj", heads * (nope + rope), q_rank, n, "linear", shard),
            ]
        else:
            groups.append(WeightGroup("q_proj", heads * (nope + rope), h, n, "linear", shard))
        return groups + [
            WeightGroup("kv_a_proj_with_mqa", kv_rank + rope, h, n, "linear", Fraction(1)),
            WeightGroup("kv_a_layernorm", 1, kv_rank, n, "norm", Fraction(1)),
            WeightGroup("kv_b_proj", heads * (nope + v_dim), kv_rank, n, "linear", shard),
            WeightGroup("o_proj", h, heads * v_dim, n, "linear", shard),
            *mla_output_gate(cfg, tp, n),
        ]
    d, kv = cfg.head_dim, cfg.num_kv_heads
    kv_share = Fraction(math.ceil(kv / tp), kv)
    groups = [
        WeightGroup("q_proj", heads * d, h, n, "linear", shard),
        WeightGroup("k_proj+v_proj", kv * d, h, 2 * n, "linear", kv_share),
        WeightGroup("o_proj", h, heads * d, n, "linear", shard),
    ]
    qwen2 = cfg.architecture.startswith("Qwen2")
    if cfg.get("attention_bias", qwen2):
        groups += [
            WeightGroup("q_bias", 1, heads * d, n, "bias", shard),
            WeightGroup("k_bias+v_bias", 1, kv * d, 2 * n, "bias", kv_share),
        ]
    if cfg.get("use_qk_norm"):
        groups.append(WeightGroup("q_norm+k_norm", 1, d, 2 * n, "norm", Fraction(1)))
    return groups


def _feed_forward(cfg: ModelConfig, tp: int, layers: int) -> list[WeightGroup]:
    h, shard = cfg.hidden_size, Fraction(1, tp)
    moe = sum(_is_moe_layer(cfg, i) for i in range(layers))
    dense = layers - moe
    groups = []
    if dense:
        inter = cfg["intermediate_size"]
        groups += [
            WeightGroup("mlp.gate+up", inter, h, 2 * dense, "linear", shard),
            WeightGroup("mlp.down", h, inter, dense, "linear", shard),
        ]
    if moe:
        experts, width = num_experts(cfg), expert_width(cfg)
        inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        groups += [
            WeightGroup("experts.gate+up", inter, width, 2 * experts * moe, "expert", shard),
            WeightGroup("experts.down", width, inter, experts * moe, "expert", shard),
            WeightGroup("router", experts, h, moe, "router", Fraction(1)),
            *latent_moe_groups(cfg, moe),
        ]
        if cfg.get("n_routed_experts"):  # DeepSeek-style routers carry a correction bias
            groups.append(WeightGroup("router.bias", 1, experts, moe, "router", Fraction(1)))
        shared = int(cfg.get("n_shared_experts") or 0) * inter
        if shared:
            groups += [
                WeightGroup("shared_experts.gate+up", shared, h, 2 * moe, "linear", shard),
                WeightGroup("shared_experts.down", h, shared, moe, "linear", shard),
            ]
    return groups


def weight_groups(cfg: ModelConfig, tp: int = 1, include_mtp: bool = True) -> list[WeightGroup]:
    """Every weight matrix of the text model, grouped, with the share one TP rank holds."""
    h, vocab, shard = cfg.hidden_size, cfg.vocab_size, Fraction(1, tp)
    extra = mtp_layers(cfg) if include_mtp else 0
    layers = cfg.num_layers + extra
    norms_per_layer = 4 if cfg.architecture == "Glm4ForCausalLM" else 2
    groups = [WeightGroup("embed_tokens", vocab, h, 1, "embed", shard)]
    if not cfg.get("tie_word_embeddings", False):
        groups.append(WeightGroup("lm_head", vocab, h, 1, "head", shard))
    groups.append(WeightGroup("norms", 1, h, norms_per_layer * layers + 1, "norm", Fraction(1)))
    groups += _attention(cfg, tp, layers)
    groups += _feed_forward(cfg, tp, layers)
    groups += attention_residual_groups(cfg, layers)
    if extra:  # MTP: eh_proj plus enorm, hnorm, shared_head.norm; embedding and head are shared
        groups += [
            WeightGroup("mtp.eh_proj", h, 2 * h, extra, "linear", Fraction(1)),
            WeightGroup("mtp.norms", 1, h, 3 * extra, "norm", Fraction(1)),
        ]
    return groups


@dataclass(frozen=True)
class WeightBytes:
    params: int
    total_bytes: int
    per_gpu_bytes: int
    source: str  # "config" or "safetensors"


def computed_weight_bytes(
    cfg: ModelConfig, scheme: WeightScheme, tp: int, include_mtp: bool = True
) -> WeightBytes:
    groups = weight_groups(cfg, tp, include_mtp)
    has_experts = num_experts(cfg) > 0
    total, per_gpu = 0, Fraction(0)
    for group in groups:
        size = scheme.group_bytes(group, has_experts)
        total += size
        per_gpu += size * group.rank_share
    params = sum(g.params for g in groups)
    return WeightBytes(params, int(total), math.ceil(per_gpu), "config")


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
REPLICATED_MARKERS = ("norm", "q_a_proj", "kv_a_proj_with_mqa", "eh_proj", "e_score_correction")


def _rank_share(name: str, cfg: ModelConfig, tp: int) -> Fraction:
    if any(marker in name for marker in REPLICATED_MARKERS) or name.endswith(".mlp.gate.weight"):
        return Fraction(1)
    if (".k_proj." in name or ".v_proj." in name) and not cfg.get("kv_lora_rank"):
        kv = cfg.num_kv_heads
        return Fraction(math.ceil(kv / tp), kv)
    return Fraction(1, tp)


def checkpoint_weight_bytes(
    folder: Path, cfg: ModelConfig, tp: int, params: int
) -> WeightBytes | None:
    """Real tensor sizes from the safetensors headers in `folder`; None when it has none.

    Floating-point tensors count at 2 bytes a value (BF16, as the GPU serves them,
    even when the file stores float32); quantized tensors and their scales as stored.

    `params` is the parameter count to report (from the config: packed INT4 and FP8
    tensors do not say how many weights they hold).
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        return None
    total, per_gpu = 0, Fraction(0)
    for path in files:
        try:
            with open(path, "rb") as handle:
                (length,) = struct.unpack("<Q", handle.read(8))
                header = json.loads(handle.read(length))
        except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                start, end = info["data_offsets"]
            except (KeyError, TypeError, ValueError):
                raise CheckpointError(f"{path}: tensor {name!r} has no data_offsets") from None
            size = end - start
            if info.get("dtype") in FLOAT_DTYPES and "scale" not in name:  # served in BF16
                size = 2 * math.prod(info.get("shape") or [])
            total += size
            per_gpu += size * _rank_share(name, cfg, tp)
    return WeightBytes(params, total, math.ceil(per_gpu), "safetensors")
