"""Fused MoE: routed tokens sorted by expert, one grouped GEMM for gate/up, one for down.

    blocks = moe_align(topk_ids, E, BLOCK_M)                    # moe_align.py
    inter[p] = SiLU(x[p // k] @ gate_e.T) * (x[p // k] @ up_e.T)  # one launch, all experts
    pairs[p] = topk_weights[p] * (inter[p] @ down_e.T)           # one launch, all experts
    out[t]   = sum over slots of pairs[t * k + slot]             # float32, then x's dtype

(p = token * k + slot, e = topk_ids[token, slot].) Each grouped GEMM program
takes one block of BLOCK_M pairs of a single expert (rows gathered through
`sorted_ids`) and one BLOCK_N slice of outputs, so an expert's weight tile is
read once per block, not once per token, and blocks of absent experts do not
exist. The gate/up program keeps two accumulators, gate rows n and up rows
I + n of the fused w13, and applies SiLU(gate) * up in fp32 in its
epilogue, so the [P, 2I] product never reaches memory. The down program
multiplies by the routing weight in its epilogue and writes each pair's row
in float32; the sum over a token's k slots is then a fixed-order torch
reduction (no atomics), so results do not depend on scheduling. It costs a
[T * k, H] float32 buffer: 1.8 GB at T = 8192 for Kimi (k = 8, H = 7168),
so prefill chunks beyond a few thousand tokens should be split by the caller.

Weight kinds (moe_weights.py): dense (bf16/fp16/fp32 experts), FP8-block
(activations quantized per token in groups of 128, fp8_act_quant.py, both
for x and for the intermediate) and INT4 group-32 (dequantized in registers
per K tile, common.load_weight_tile). Accumulation is always fp32; the
intermediate is stored in x's dtype (what a BF16 model's SiLU(gate) * up
produces) before the down projection.

Tiles: BLOCK_M from the mean pairs per expert (decode routes one or two
pairs to most experts: 16 rows; prefill: 64), BLOCK_N = 64, BLOCK_K = 128
for FP8 (one scale block) and 64 otherwise. Reasoned defaults, not yet tuned
on a GPU (docs/GPU_KERNELS.md).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from engine.gpu_kernels.common import (
    KIND_FP8,
    dot_config,
    interpreting,
    load_act_tile,
    load_weight_tile,
)
from engine.gpu_kernels.fp8_act_quant import quantize_activations
from engine.gpu_kernels.layout import DENSE, FLOAT_ACTS, FP8, as_bytes, check_tensor, dense_last
from engine.gpu_kernels.moe_align import MoeBlocks, moe_align
from engine.gpu_kernels.moe_weights import DenseExperts, Experts, Fp8BlockExperts, Int4Experts


@triton.jit
def _moe_gemm_kernel(
    a_ptr,
    as_ptr,
    w_ptr,
    ws_ptr,
    out_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    topk_weights_ptr,
    num_pairs,
    a_row_div,
    N,
    K,
    up_scale_rows,
    stride_am,
    stride_asm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_sk,
    stride_om,
    SWIGLU: tl.constexpr,
    ROUTED_WEIGHT: tl.constexpr,
    KIND: tl.constexpr,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Blocks vary fastest: consecutive programs are blocks of one expert at the
    # same N slice, which read the same weight tiles (from L2 after the first).
    block = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + block).to(tl.int64)
    if expert < 0:
        return  # past the last expert's padded run
    ids = tl.load(sorted_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = ids < num_pairs  # padding slots hold num_pairs
    a_rows = ids // a_row_div  # gate/up: the pair's token (p // k); down: the pair itself
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    w_base = w_ptr + expert * stride_we
    s_base = ws_ptr + expert * stride_se
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        a, a_scale = load_act_tile(a_ptr, as_ptr, a_rows, k, k0, row_mask, k_mask, stride_am,
                                   stride_asm, KIND, SCALE_K, DOT)  # fmt: skip
        w, w_scale = load_weight_tile(w_base, s_base, n, k, k0, n_mask, k_mask, stride_wn,
                                      stride_sn, stride_sk, KIND, SCALE_N, SCALE_K, DOT)  # fmt: skip
        part = tl.dot(a, w, input_precision=PRECISION)
        if KIND == KIND_FP8:
            part = part * (a_scale[:, None] * w_scale[None, :])
        acc += part
        if SWIGLU:
            # The up rows sit N rows further down w13; their scales up_scale_rows further.
            w, w_scale = load_weight_tile(w_base + N * stride_wn, s_base + up_scale_rows * stride_sn,
                                          n, k, k0, n_mask, k_mask, stride_wn, stride_sn,
                                          stride_sk, KIND, SCALE_N, SCALE_K, DOT)  # fmt: skip
            part = tl.dot(a, w, input_precision=PRECISION)
            if KIND == KIND_FP8:
                part = part * (a_scale[:, None] * w_scale[None, :])
            acc_up += part
    if SWIGLU:
        acc = acc / (1.0 + tl.exp(-acc)) * acc_up  # SiLU(gate) * up, in fp32
    if ROUTED_WEIGHT:
        acc = (
            acc * tl.load(topk_weights_ptr + ids, mask=row_mask, other=0.0).to(tl.float32)[:, None]
        )
    out_ptrs = out_ptr + ids[:, None] * stride_om + n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])


def block_m_for(num_pairs: int, num_experts: int) -> int:
    """Rows per block from the mean pairs per expert (host-known sizes only; no sync)."""
    if interpreting():
        return 16
    mean = num_pairs / num_experts
    return 16 if mean <= 16 else 32 if mean <= 48 else 64


def _tiles(kind: int) -> dict:
    """BLOCK_N/K, warps and stages. Packed experts get 8 warps: dequantizing two weight
    tiles (gate and up) with their scales in registers spills with 4 (sm_90, Triton
    3.6: 392-528 B/thread for INT4, 8 B for FP8 at BLOCK_M = 64; none with 8)."""
    if interpreting():
        return dict(BLOCK_N=32, BLOCK_K=128 if kind == FP8 else 32, num_warps=1, num_stages=1)
    warps = 4 if kind == DENSE else 8
    return dict(BLOCK_N=64, BLOCK_K=128 if kind == FP8 else 64, num_warps=warps, num_stages=3)


def _weights(experts: Experts, stage: str):
    """(weight, scales, scale strides (e, n, k), up_scale_rows, SCALE_N, SCALE_K) of one stage."""
    up = stage == "w13"
    if isinstance(experts, Fp8BlockExperts):
        w = as_bytes(getattr(experts, stage))
        s = getattr(experts, f"{stage}_scale_inv").contiguous()
        bn, bk = experts.block
        return w, s, s.stride(), (s.shape[1] // 2 if up else 0), bn, bk
    if isinstance(experts, Int4Experts):
        w = dense_last(getattr(experts, f"{stage}_packed"))
        s = dense_last(getattr(experts, f"{stage}_scale"))
        return w, s, s.stride(), (w.shape[1] // 2 if up else 0), 1, experts.group_size
    w = dense_last(getattr(experts, stage))
    return w, w, (0, 0, 0), 0, 1, 1


def _launch(a, a_scale, experts: Experts, stage: str, blocks: MoeBlocks, out, n: int, k: int,
            a_row_div: int, topk_weights=None) -> None:  # fmt: skip
    kind = experts.kind
    w, s, (sse, ssn, ssk), up_rows, scale_n, scale_k = _weights(experts, stage)
    cfg = _tiles(kind)
    dot, precision = dot_config(a.dtype, kind, a.device)
    grid = (blocks.block_expert.shape[0], triton.cdiv(n, cfg["BLOCK_N"]))
    _moe_gemm_kernel[grid](
        a,
        a if a_scale is None else a_scale,
        w,
        s,
        out,
        blocks.sorted_ids,
        blocks.block_expert,
        out if topk_weights is None else topk_weights,
        blocks.num_pairs,
        a_row_div,
        n,
        k,
        up_rows,
        a.stride(0),
        0 if a_scale is None else a_scale.stride(0),
        w.stride(0),
        w.stride(1),
        sse,
        ssn,
        ssk,
        out.stride(0),
        SWIGLU=stage == "w13",
        ROUTED_WEIGHT=topk_weights is not None,
        KIND=kind,
        SCALE_N=scale_n,
        SCALE_K=scale_k,
        BLOCK_M=blocks.block_m,
        DOT=dot,
        PRECISION=precision,
        **cfg,
    )


def _quantized(x: torch.Tensor, experts: Experts):
    """(activations as the kernel reads them, their scales or None)."""
    if experts.kind == FP8:
        x_q, scales = quantize_activations(x, experts.block[1])
        return as_bytes(x_q), scales
    return dense_last(x), None


def moe_gate_up(hidden: torch.Tensor, blocks: MoeBlocks, experts: Experts) -> torch.Tensor:
    """SiLU(x @ gate.T) * (x @ up.T) for every pair -> [T * k, I] in hidden's dtype.

    Rows of pairs that no block holds (dropped ids) are left unwritten.
    """
    tokens, h = hidden.shape
    inter = torch.empty(blocks.num_pairs, experts.intermediate, dtype=hidden.dtype,
                        device=hidden.device)  # fmt: skip
    if blocks.num_pairs and experts.intermediate:
        a, a_scale = _quantized(hidden, experts)
        _launch(a, a_scale, experts, "w13", blocks, inter, experts.intermediate, h, blocks.top_k)
    return inter


def moe_down(
    inter: torch.Tensor, blocks: MoeBlocks, experts: Experts, topk_weights: torch.Tensor
) -> torch.Tensor:
    """topk_weight * (inter @ down.T) per pair -> float32 [T * k, H]; dropped pairs stay 0."""
    pairs = torch.zeros(blocks.num_pairs, experts.hidden, dtype=torch.float32, device=inter.device)
    if blocks.num_pairs and experts.intermediate:
        a, a_scale = _quantized(inter, experts)
        weights = topk_weights.reshape(-1).float().contiguous()
        _launch(a, a_scale, experts, "w2", blocks, pairs, experts.hidden, experts.intermediate, 1,
                weights)  # fmt: skip
    return pairs


def fused_moe(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Experts,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The routed experts' output for hidden [T, H] -> [T, H] in hidden's dtype.

    topk_ids [T, k] int32/int64 (ids outside [0, E) contribute nothing, see
    moe_align), topk_weights [T, k] float (applied as given: normalisation
    and routed scaling are the router's).
    """
    check_tensor("hidden", hidden, 2, FLOAT_ACTS, hidden.device)
    check_tensor("topk_ids", topk_ids, 2, (torch.int32, torch.int64), hidden.device)
    check_tensor("topk_weights", topk_weights, 2, FLOAT_ACTS, hidden.device)
    tokens, h = hidden.shape
    if topk_ids.shape[0] != tokens or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
            f"must both be [tokens = {tokens}, top_k]"
        )
    experts.check(h, hidden.dtype, hidden.device)
    if out is not None:
        check_tensor("out", out, 2, FLOAT_ACTS, hidden.device)
        if tuple(out.shape) != (tokens, h):
            raise ValueError(f"out has shape {tuple(out.shape)}, expected {(tokens, h)}")
    top_k = topk_ids.shape[1]
    if tokens == 0 or top_k == 0:
        return out.zero_() if out is not None else hidden.new_zeros(tokens, h)
    num_experts = experts.num_experts
    blocks = moe_align(topk_ids, num_experts, block_m_for(tokens * top_k, num_experts))
    inter = moe_gate_up(dense_last(hidden), blocks, experts)
    pairs = moe_down(inter, blocks, experts, topk_weights)
    summed = pairs.view(tokens, top_k, h).sum(dim=1)
    if out is None:
        return summed.to(hidden.dtype)
    return out.copy_(summed)


__all__ = [
    "DenseExperts",
    "Fp8BlockExperts",
    "Int4Experts",
    "MoeBlocks",
    "fused_moe",
    "moe_align",
    "moe_down",
    "moe_gate_up",
]
