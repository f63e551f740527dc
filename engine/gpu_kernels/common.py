"""What the GEMM kernels share: the tile loaders and the dot dtype (kinds and checks: layout.py).

Weights arrive in their checkpoint's layout (engine/weights/ knows the
formats; the loaders here read the same bytes):

- dense:  float weights [N, K] in the activations' dtype;
- FP8:    float8_e4m3fn [N, K], passed to kernels as uint8 bytes (the
          interpreter has no fp8 tensors), with float32 `weight_scale_inv`
          [ceil(N/BN_s), ceil(K/BK_s)], one per (BN_s x BK_s) block (128x128);
- INT4:   int32 [N, ceil(K/8)], eight nibbles per word, the first value in
          the lowest nibble, each nibble = value + 8; scales [N, ceil(K/G)]
          (bfloat16 in Kimi's checkpoints), symmetric, group G = 32.

Every loader returns a [BLOCK_K, BLOCK_N] tile in the dot dtype plus what
must multiply the fp32 partial product afterwards. FP8 values are exact in
bf16 and fp32 and INT4 values are small integers, so widening never rounds;
INT4 tiles are scaled before the dot (a scale per group of K, so a tile may
span several groups), which on a GPU rounds each weight to the dot dtype once,
exactly as `dequantize_packed_int4(..., dtype=bfloat16)` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.attention.triton import interpreting
from engine.attention.triton.target import capability
from engine.gpu_kernels.layout import DENSE, FP8, INT4

__all__ = [
    "KIND_DENSE",
    "KIND_FP8",
    "KIND_INT4",
    "dot_config",
    "interpreting",
    "load_act_tile",
    "load_weight_tile",
]

# The weight kinds as jit code may read them. Triton's compiler reads only module
# globals made with tl.constexpr (its interpreter reads any, so a plain int passes
# the CPU tests and fails to compile on a GPU, as layout.INT4 once did).
KIND_DENSE = tl.constexpr(DENSE)
KIND_FP8 = tl.constexpr(FP8)
KIND_INT4 = tl.constexpr(INT4)


@triton.jit
def load_weight_tile(
    w_ptr,
    s_ptr,
    n,
    k,
    k0,
    n_mask,
    k_mask,
    stride_wn,
    stride_sn,
    stride_sk,
    KIND: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    DOT: tl.constexpr,
):
    """W^T tile [BLOCK_K, BLOCK_N] at rows n, columns k in DOT, and its column scales [BLOCK_N].

    DENSE: the scales are ones. FP8: the tile's K range lies in one scale
    block (callers use BLOCK_K dividing SCALE_K, tiles aligned at 0), so each
    column n has one scale, that of its row block n // SCALE_N. INT4: the
    group scales are already applied, so the returned scales are ones.
    """
    mask = k_mask[:, None] & n_mask[None, :]
    scales = tl.full(n.shape, 1.0, tl.float32)
    if KIND == KIND_FP8:
        raw = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None], mask=mask, other=0)
        w = raw.to(tl.float8e4nv, bitcast=True).to(DOT)
        scale_ptrs = s_ptr + (n // SCALE_N) * stride_sn + (k0 // SCALE_K) * stride_sk
        scales = tl.load(scale_ptrs, mask=n_mask, other=0.0)
    elif KIND == KIND_INT4:
        w = tl.trans(
            load_int4_rows(
                w_ptr, s_ptr, n, k, k0, n_mask, k_mask, stride_wn, stride_sn, stride_sk, SCALE_K
            )  # fmt: skip
        ).to(DOT)
    else:
        w = tl.load(w_ptr + n[None, :] * stride_wn + k[:, None], mask=mask, other=0.0).to(DOT)
    return w, scales


@triton.jit
def load_int4_rows(
    w_ptr,
    s_ptr,
    n,
    k,
    k0,
    n_mask,
    k_mask,
    stride_wn,
    stride_sn,
    stride_sk,
    GROUP: tl.constexpr,
):
    """Weight rows n, columns k = k0 + arange(BLOCK_K), as a scaled fp32 [BLOCK_N, BLOCK_K] tile.

    Each packed word and each group scale is loaded once, along the rows as
    they lie in memory: [BLOCK_N, BLOCK_K / 8] words, then the eight nibbles
    of every word by shifts on a third axis, folded back into order (value j
    of word w is column 8w + j). Loading a [BLOCK_K, BLOCK_N] tile of
    `word[k // 8]` instead reads every word 8 times and every scale 32 times
    across the rows' stride: on an H200 that ran W4A16 at 45 GB/s (issue 28).
    k0 is a multiple of 8 (callers tile K from 0).
    """
    BLOCK_N: tl.constexpr = n.shape[0]
    BLOCK_K: tl.constexpr = k.shape[0]
    WORDS: tl.constexpr = BLOCK_K // 8
    # A word holds columns 8w..8w+7: it is needed when any of them is inside K.
    word_in = tl.max(tl.reshape(k_mask.to(tl.int32), (WORDS, 8)), 1) > 0
    kw = k0 // 8 + tl.arange(0, WORDS)
    words = tl.load(
        w_ptr + n[:, None] * stride_wn + kw[None, :],
        mask=n_mask[:, None] & word_in[None, :],
        other=0,
    )
    # Arithmetic shift of the signed word, then the nibble: 0..15 -> -8..7.
    nibbles = (words[:, :, None] >> (tl.arange(0, 8) * 4)[None, None, :]) & 0xF
    q = (tl.reshape(nibbles, (BLOCK_N, BLOCK_K)) - 8).to(tl.float32)
    if BLOCK_K % GROUP == 0:
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        group_in = tl.max(tl.reshape(k_mask.to(tl.int32), (GROUPS, GROUP)), 1) > 0
        g = k0 // GROUP + tl.arange(0, GROUPS)
        scale = tl.load(
            s_ptr + n[:, None] * stride_sn + g[None, :] * stride_sk,
            mask=n_mask[:, None] & group_in[None, :],
            other=0.0,
        ).to(tl.float32)
        w = tl.reshape(
            tl.reshape(q, (BLOCK_N, GROUPS, GROUP)) * scale[:, :, None], (BLOCK_N, BLOCK_K)
        )
    else:
        # Groups wider than the tile (or not dividing it): a scale per column, from cache.
        scale = tl.load(
            s_ptr + n[:, None] * stride_sn + (k // GROUP)[None, :] * stride_sk,
            mask=n_mask[:, None] & k_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        w = q * scale
    return w


@triton.jit
def load_act_tile(
    a_ptr,
    as_ptr,
    rows,
    k,
    k0,
    row_mask,
    k_mask,
    stride_am,
    stride_asm,
    KIND: tl.constexpr,
    SCALE_K: tl.constexpr,
    DOT: tl.constexpr,
):
    """Activation tile [BLOCK_M, BLOCK_K] in DOT and its row scales [BLOCK_M].

    With FP8 weights the activations are e4m3 bytes with one float32 scale
    per row and group of SCALE_K columns (one group per tile); otherwise
    they are loaded as they are and the scales are ones.
    """
    mask = row_mask[:, None] & k_mask[None, :]
    ptrs = a_ptr + rows[:, None] * stride_am + k[None, :]
    if KIND == KIND_FP8:
        a = tl.load(ptrs, mask=mask, other=0).to(tl.float8e4nv, bitcast=True).to(DOT)
        scales = tl.load(as_ptr + rows * stride_asm + k0 // SCALE_K, mask=row_mask, other=0.0)
    else:
        a = tl.load(ptrs, mask=mask, other=0.0).to(DOT)
        scales = tl.full(rows.shape, 1.0, tl.float32)
    return a, scales


def dot_config(act_dtype: torch.dtype, kind: int, device: torch.device) -> tuple[tl.dtype, str]:
    """The dtype tl.dot multiplies in and its input precision.

    Under TRITON_INTERPRET=1 everything multiplies in fp32: the interpreter's
    tl.dot gives garbage for bf16 operands (engine.attention.triton.common).
    On a GPU: FP8 x FP8 on tensor cores where the GPU has them (compute
    capability 8.9 and later), else in bf16 (e4m3 values are exact in it);
    fp32 activations in full IEEE precision (not tf32); bf16/fp16 in their
    own type with fp32 accumulation.
    """
    if interpreting() or (act_dtype == torch.float32 and kind != FP8):
        return tl.float32, "ieee"
    if kind == FP8:
        gpu = capability(device)  # the planned GPU's too, for the compile check
        if gpu is not None and gpu >= (8, 9):
            return tl.float8e4nv, "tf32"
        return tl.bfloat16, "tf32"
    return (tl.float16 if act_dtype == torch.float16 else tl.bfloat16), "tf32"
