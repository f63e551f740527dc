"""Multi-head latent attention over the paged latent pool, in torch (the CPU reference).

Per token the cache holds `[c (lora_rank) | k_rope (rope_dim)]`. Head h sees
    k_h = [W_UK[h] c | k_rope]      v_h = W_UV[h] c
with W_UK and W_UV the two halves of kv_b_proj. Two exact ways to attend:

- expanded: materialise k_h and v_h for the whole context and run ordinary
  attention with head dim nope_dim + rope_dim. The work of expanding grows
  with context length times heads times (nope_dim + v_dim) times lora_rank;
  worth it when many queries share it (prefill).
- absorbed: q_h·k_h = (W_UK[h]ᵀ q_nope_h)·c + q_rope_h·k_rope, so fold W_UK
  into the query once per query and attend over the latent rows directly,
  as multi-query attention with a single 576-wide KV head whose values are
  the latents themselves; the output's W_UV comes after. The context is read
  once, never expanded: the decode path.

Both read the context back from the pool (this step's tokens included), so
fp8 mode always attends over the stored values, like the GQA backend. FP8
dequant factors fold into the query (scores) and the output (values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata
from engine.host import bf16_products

PATHS = ("auto", "absorbed", "expanded")


@dataclass(frozen=True)
class MLADims:
    num_heads: int
    nope_dim: int  # qk_nope_head_dim
    rope_dim: int  # qk_rope_head_dim
    v_dim: int  # v_head_dim
    lora_rank: int  # kv_lora_rank


def choose_path(meta: AttentionMetadata, dims: MLADims) -> str:
    """The cheaper path for this step, by multiply-add count.

    Expanding costs a kv_b_proj product per context row plus attention at
    width nope+rope+v; absorbing costs two small products per query plus
    attention at width 2*lora_rank+rope. One query per sequence always
    absorbs; long prefills expand.
    """
    if meta.decode_only:
        # One query per sequence: cheaper absorbed at any context past one token, and the
        # only path the decode kernel (and a replayed graph, which has no slot grid) takes.
        return "absorbed"
    batch, queries = meta.query_index.shape
    context = meta.context_slots.shape[1]
    h, r = dims.num_heads, dims.lora_rank
    head_width = dims.nope_dim + dims.v_dim
    expand = batch * context * h * r * head_width
    expand += batch * h * queries * context * (dims.nope_dim + dims.rope_dim + dims.v_dim)
    absorb = batch * queries * h * r * head_width
    absorb += batch * h * queries * context * (2 * r + dims.rope_dim)
    return "absorbed" if absorb <= expand else "expanded"


def mla_attention(
    layer: int,
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    kv_b_weight: torch.Tensor,
    pool,
    meta: AttentionMetadata,
    dims: MLADims,
    softmax_scale: float,
    path: str = "auto",
    backend=None,
    latent_grid=None,
) -> torch.Tensor:
    """Write this step's latents, attend over each sequence's context; returns [T, H, v_dim].

    q_nope [T, H, nope], q_rope [T, H, rope] (rotated), latent [T, lora_rank]
    (normalised), k_rope [T, rope] (rotated), kv_b_weight [H*(nope+v), lora_rank].
    An attention backend with an `mla_decode` method (the Triton and CPU ones) takes
    absorbed decode steps; it returns None for steps it leaves to torch. `latent_grid`
    (engine/cpu_kernels/mla_decode.py's LatentGrid, CPU only) offers it W_UK and W_UV
    as grid weights in place of kv_b_weight's halves.
    """
    if path not in PATHS:
        raise ValueError(f"MLA path {path!r}: use one of {PATHS}")
    if not meta.decode_only and len(meta.query_lens) > 1:
        # A mixed or multi-sequence step: each sequence alone (the decode ones together,
        # for the decode kernel), as the paths below pad every sequence to the longest.
        out = q_nope.new_empty(q_nope.shape[0], dims.num_heads, dims.v_dim)
        for tokens, part in meta.ragged_groups():
            args = (q_nope[tokens], q_rope[tokens], latent[tokens], k_rope[tokens])
            out[tokens] = mla_attention(
                layer,
                *args,
                kv_b_weight,
                pool,
                part,
                dims,
                softmax_scale,
                path,
                backend,
                latent_grid,
            )
        return out
    if path == "auto":
        path = choose_path(meta, dims)
    kernel = getattr(backend, "mla_decode", None)
    if kernel is not None and path == "absorbed" and meta.decode_only:
        args = (q_nope, q_rope, latent, k_rope, kv_b_weight, pool, meta, dims, softmax_scale)
        out = kernel(layer, *args) if latent_grid is None else kernel(layer, *args, latent_grid)
        if out is not None:
            return out
    pool.write(layer, latent, k_rope, meta.slot_mapping)
    rows, latent_factor, rope_factor = pool.gather(layer, meta.context_slots, q_nope.dtype)
    attend = _absorbed if path == "absorbed" else _expanded
    out = attend(
        q_nope, q_rope, rows, latent_factor, rope_factor, kv_b_weight, meta, dims, softmax_scale
    )
    return out.flatten(0, 1)[meta.output_index]


def _expanded(
    q_nope, q_rope, rows, latent_factor, rope_factor, kv_b_weight, meta, dims, scale
) -> torch.Tensor:
    """Materialise per-head K and V from the latents, then ordinary attention -> [B, Q, H, v]."""
    batch, context = rows.shape[:2]
    h, r = dims.num_heads, dims.lora_rank
    latent, rope = rows[..., :r], rows[..., r:]
    if latent_factor != 1.0:
        latent = latent * latent_factor
    if rope_factor != 1.0:
        rope = rope * rope_factor
    kv = bf16_products.linear(latent, kv_b_weight).view(
        batch, context, h, dims.nope_dim + dims.v_dim
    )
    k_nope, values = kv.split([dims.nope_dim, dims.v_dim], dim=-1)
    keys = torch.cat([k_nope, rope.unsqueeze(2).expand(-1, -1, h, -1)], dim=-1)
    queries = torch.cat([q_nope, q_rope], dim=-1)[meta.query_index]  # [B, Q, H, nope+rope]
    values = _as_wide_as(values, keys.shape[-1])
    out = F.scaled_dot_product_attention(
        queries.transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=meta.mask,
        is_causal=meta.is_causal_single,
        scale=scale,
    )  # [B, H, Q, v (padded)]
    return out.transpose(1, 2)[..., : dims.v_dim]


def _as_wide_as(values: torch.Tensor, width: int) -> torch.Tensor:
    """Values zero-padded to the keys' head width on CPU: torch's CPU SDPA takes its
    flash kernel only when values and keys are as wide, and otherwise its math path,
    which materialises every score and mask in float32. For Kimi's 192-wide keys and
    128-wide values over 2,048 tokens the math path was 10-20x slower per layer (75% of a
    prefill's time); the padded columns come out as zeros and are sliced off."""
    if values.device.type != "cpu" or values.shape[-1] == width:
        return values
    return F.pad(values, (0, width - values.shape[-1]))


def _absorbed(
    q_nope, q_rope, rows, latent_factor, rope_factor, kv_b_weight, meta, dims, scale
) -> torch.Tensor:
    """Attend over latent rows with W_UK folded into q and W_UV applied after -> [B, Q, H, v]."""
    h, r = dims.num_heads, dims.lora_rank
    per_head = kv_b_weight.view(h, dims.nope_dim + dims.v_dim, r)
    w_uk, w_uv = per_head[:, : dims.nope_dim], per_head[:, dims.nope_dim :]
    q_latent = bf16_products.einsum("thn,hnr->thr", q_nope, w_uk)
    # Dequant factors of the stored rows, moved onto the (smaller) query side.
    if latent_factor != 1.0:
        q_latent = q_latent * latent_factor
    if rope_factor != 1.0:
        q_rope = q_rope * rope_factor
    queries = torch.cat([q_latent, q_rope], dim=-1)[meta.query_index]  # [B, Q, H, r+rope]
    keys = rows.unsqueeze(1)  # [B, 1, L, r+rope]: one KV head shared by all query heads
    # The values are the latents, the keys' first r columns. On CPU the keys themselves
    # serve as values (the rope columns' outputs are dropped): values as wide as the keys
    # keep torch's flash kernel (_as_wide_as says why), with no copy.
    values = keys if keys.device.type == "cpu" else keys[..., :r]
    queries = queries.transpose(1, 2)  # [B, H, Q, r+rope]
    mask = meta.mask
    if _fold_heads(keys, mask, h, meta.is_causal_single):
        # One KV head: the heads' queries are rows of one query block, their mask rows
        # repeated per head (row h*Q + q is query q of head h).
        batch, _, count, width = queries.shape
        out_latent = F.scaled_dot_product_attention(
            queries.reshape(batch, 1, h * count, width),
            keys,
            values,
            attn_mask=None if mask is None else mask.repeat(1, 1, h, 1),
            scale=scale,
        )[..., :r].view(batch, h, count, r)
    else:
        out_latent = F.scaled_dot_product_attention(
            queries,
            keys,
            values,
            attn_mask=mask,
            is_causal=meta.is_causal_single,
            scale=scale,
            enable_gqa=True,
        )[..., :r]  # [B, H, Q, r]
    out = bf16_products.einsum("bhqr,hvr->bqhv", out_latent, w_uv)
    if latent_factor != 1.0:
        out = out * latent_factor
    return out


# Elements of the per-head repeated mask a folded absorbed step may build (bools).
_FOLDED_MASK_LIMIT = 32 << 20


def _fold_heads(keys: torch.Tensor, mask: torch.Tensor | None, heads: int, causal: bool) -> bool:
    """Whether the absorbed SDPA runs as one head of heads x queries rows (CPU): torch's
    CPU flash kernel then multiplies blocks of the shared latent keys by all heads'
    queries at once instead of head by head. A 64-token chunk over 1,024 cached
    positions, 16 heads: 17 ms a layer against 35 (2 Zen 3 cores). Not for a causal
    step without a mask (the fold would mix the heads' positions), nor where the
    repeated mask would be large."""
    if keys.device.type != "cpu" or causal:
        return False
    return mask is None or mask.numel() * heads <= _FOLDED_MASK_LIMIT
