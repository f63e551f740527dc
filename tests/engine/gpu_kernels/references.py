"""Torch references for the GPU kernel tests: weights in the checkpoint formats and their meaning.

Weights are built and dequantized with engine/weights (the loader's own
format code: pack_int4 / dequantize_packed_int4, quantize_fp8_block /
dequantize_fp8_block), so the kernels are held to what the checkpoint means,
not to a second reading of the format written for the kernels. References
compute in float32 with torch's matmul; the MoE reference walks tokens and
slots one by one (no sorting, no blocks), independently of moe_align.

Tolerances are per element. `summation_bound` is the classic bound on two
float32 dot products of length K that differ only in summation order:
each is within K * 2**-24 * sum|a_i * w_i| of the exact value.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.gpu_kernels.moe_weights import DenseExperts, Fp8BlockExperts, Int4Experts
from engine.weights.fp8_block_format import dequantize_fp8_block, quantize_fp8_block
from engine.weights.int4_packed import dequantize_packed_int4, pack_int4

FP32_UNIT = 2.0**-24
# One bf16 unit in the last place, relative: the interpreter's float32 -> bf16
# cast truncates (DESIGN.md §3 and tests/engine/triton), so an output may be
# off by up to one ulp there; a GPU rounds to nearest (half of this).
BF16_ULP = 2.0**-7


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def int4_weight(n: int, k: int, group: int = 32, device="cpu"):
    """(packed int32 [n, ceil(k/8)], bf16 scales [n, ceil(k/group)], fp32 dequantized [n, k])."""
    values = torch.randint(-8, 8, (n, k))
    # Scales vary per group by up to 16x, as real ones do; outputs stay O(1).
    scale = (torch.rand(n, cdiv(k, group)) * 0.15 + 0.01) * k**-0.5
    scale = scale.bfloat16()
    packed = pack_int4(values)
    deq = dequantize_packed_int4(packed, scale, (n, k), group, torch.float32)
    return packed.to(device), scale.to(device), deq.to(device)


def fp8_weight(n: int, k: int, block=(128, 128), device="cpu"):
    """(e4m3 [n, k], float32 scale_inv per block, fp32 dequantized [n, k])."""
    # Blocks of different magnitude (2**-3 .. 2**2), so a wrong block index shows.
    grid = (cdiv(n, block[0]), cdiv(k, block[1]))
    magnitude = 2.0 ** torch.randint(-3, 3, grid).float()
    magnitude = magnitude.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k]
    weight, scale_inv = quantize_fp8_block(torch.randn(n, k) * magnitude * k**-0.5, block)
    deq = dequantize_fp8_block(weight, scale_inv, block, torch.float32)
    return weight.to(device), scale_inv.to(device), deq.to(device)


def dequantize_activations(x_q: torch.Tensor, scales: torch.Tensor, group: int) -> torch.Tensor:
    k = x_q.shape[1]
    return x_q.float() * scales.float().repeat_interleave(group, dim=1)[:, :k]


def summation_bound(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per-element bound on |kernel - torch| for a @ w.T in float32 from summation order alone."""
    k = a.shape[1]
    return 2 * k * FP32_UNIT * (a.float().abs() @ w.float().abs().T)


def assert_within(out: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor | float, what: str):
    """Every element within its tolerance; NaN fails (a comparison with NaN is False)."""
    err = (out.float().cpu() - ref.float().cpu()).abs()
    tol = torch.as_tensor(tol, dtype=torch.float32).cpu()
    ok = err <= tol
    if not bool(ok.all()):
        worst = int((err - tol).nan_to_num(float("inf")).argmax())
        raise AssertionError(
            f"{what}: {int((~ok).sum())} of {err.numel()} elements off; worst at flat index "
            f"{worst}: |err| {err.view(-1)[worst]:.4g} > tol {tol.expand_as(err).reshape(-1)[worst]:.4g}"
        )


def make_experts(kind: str, e: int, h: int, i: int, dtype: torch.dtype, device):
    """(experts in the kernel's layout, fp32 dequantized w13 [E, 2I, H], w2 [E, H, I])."""
    if kind == "dense":
        w13 = (torch.randn(e, 2 * i, h) * h**-0.5).to(dtype)
        w2 = (torch.randn(e, h, i) * i**-0.5).to(dtype)
        return DenseExperts(w13.to(device), w2.to(device)), w13.float(), w2.float()
    if kind == "int4":
        up = [int4_weight(2 * i, h) for _ in range(e)]
        down = [int4_weight(h, i) for _ in range(e)]
        p13, s13, d13 = (torch.stack([u[j] for u in up]) for j in range(3))
        p2, s2, d2 = (torch.stack([d[j] for d in down]) for j in range(3))
        experts = Int4Experts(p13.to(device), s13.to(device), p2.to(device), s2.to(device), i)
        return experts, d13, d2
    # FP8: gate and up quantized as the checkpoint's separate tensors, then stacked.
    q13, s13, d13, q2, s2, d2 = [], [], [], [], [], []
    for _ in range(e):
        gate, up, down = fp8_weight(i, h), fp8_weight(i, h), fp8_weight(h, i)
        q13.append(torch.cat([gate[0], up[0]]))
        s13.append(torch.cat([gate[1], up[1]]))
        d13.append(torch.cat([gate[2], up[2]]))
        q2.append(down[0])
        s2.append(down[1])
        d2.append(down[2])
    experts = Fp8BlockExperts(*(torch.stack(t).to(device) for t in (q13, s13, q2, s2)))
    return experts, torch.stack(d13), torch.stack(d2)


def moe_reference(x, ids, weights, w13, w2, inter_dtype, act_quant=None):
    """Token by token, slot by slot: sum_j weight * down(SiLU(gate(x)) * up(x)) in float32.

    The intermediate is rounded to inter_dtype as the kernel stores it; with
    `act_quant` (FP8 experts) x and the intermediate are quantized per token
    and dequantized first, as the kernel's FP8 activations mean.
    Returns (out [T, H], inter [T * k, I]: each pair's intermediate, zeros for dropped pairs).
    """
    x, w13, w2 = x.float().cpu(), w13.float().cpu(), w2.float().cpu()
    ids, weights = ids.cpu(), weights.float().cpu()
    tokens, top_k = ids.shape
    i = w13.shape[1] // 2
    out = torch.zeros(tokens, x.shape[1])
    inter = torch.zeros(tokens * top_k, i)
    for t in range(tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            if not 0 <= e < w13.shape[0]:
                continue
            xt = x[t : t + 1] if act_quant is None else act_quant(x[t : t + 1])
            gate_up = xt @ w13[e].T
            a = (F.silu(gate_up[:, :i]) * gate_up[:, i:]).to(inter_dtype).float()
            inter[t * top_k + j] = a[0]
            if act_quant is not None:
                a = act_quant(a)
            out[t] += weights[t, j] * (a @ w2[e].T)[0]
    return out, inter
