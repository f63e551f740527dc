"""Quantized-weight kernels for bench/gpu_check.py: W4A16, FP8-block GEMM, fused MoE, on Kimi shapes.

Correctness on realistic shapes with random data, against torch in float32
on weights dequantized by torch (rel_err = max|out - ref| / max|ref|):
- FP8 activation quantization: the Triton kernel's bytes and scales must
  equal torch's exactly (the interpreter cannot check this, DESIGN.md §3);
- W4A16 and FP8-block GEMMs at N = 18432, K = 7168 (a DeepSeek/Kimi dense MLP);
- the fused MoE at Kimi's routed experts (H = 7168, I = 2048, 384 experts,
  top-8) for BF16, FP8-block and INT4 experts.
Timings (CUDA events, L2 flushed; medians), each kernel against:
- `torch_bf16_ms`: torch on weights already dequantized to BF16 (what the
  engine does today: dequantize at load, 2-4x the memory);
- `torch_dequant_ms`: torch dequantizing the weights, then matmul, per call;
- FP8 only, `scaled_mm_rowwise_ms` / `scaled_mm_tensor_ms`: torch._scaled_mm on
  e4m3 operands with per-token x per-output-channel scales / one scale each.
  These are coarser quantizations than 128x128 blocks (their rel_err is
  reported too); they show what a vendor FP8 GEMM costs, quantization of
  the operands excluded.
The MoE baselines loop over the experts that received tokens, as
engine/layers/moe.py does. Failures are reported per case, never raised.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SIZES = {
    "full": dict(dense=[(1, 7168, 18432), (64, 7168, 18432), (2048, 7168, 18432)],
                 experts=384, hidden=7168, inter=2048, top_k=8, moe_tokens=[1, 64, 1024],
                 check_tokens=64, iters=10, warmup=2, dequant_iters=3),
    "smoke": dict(dense=[(3, 160, 96)], experts=8, hidden=160, inter=96, top_k=2,
                  moe_tokens=[5], check_tokens=5, iters=1, warmup=0, dequant_iters=1),
}  # fmt: skip
# rel_err bound: bf16 outputs and intermediates, INT4 weights rounded to bf16 before the dot,
# FP8 intermediates re-quantized (observed on CPU at these sizes: about 5e-3).
TOL = 2e-2


def plan(mode: str) -> dict:
    """Shapes and weight bytes of the quantized-kernel section (for --dry-run)."""
    s = SIZES[mode]
    e, h, i = s["experts"], s["hidden"], s["inter"]
    moe_params = e * 3 * h * i
    return {
        "dense": s["dense"],
        "moe": {
            "experts": e,
            "hidden": h,
            "inter": i,
            "top_k": s["top_k"],
            "tokens": s["moe_tokens"],
        },
        "moe_weight_bytes": {
            "bf16": 2 * moe_params,
            "fp8": moe_params,
            "int4": moe_params // 2 + 2 * moe_params // 32,  # nibbles + a bf16 scale per 32
        },
    }


def dequant_int4(packed, scale, k: int, group: int = 32, dtype=torch.float32) -> torch.Tensor:
    """Torch dequantization of pack-quantized INT4 [..., N, K/8] on any device."""
    shifts = torch.arange(8, dtype=torch.int32, device=packed.device) * 4
    q = ((packed.unsqueeze(-1) >> shifts) & 0xF).flatten(-2)[..., :k] - 8
    return (q.float() * scale.float().repeat_interleave(group, -1)[..., :k]).to(dtype)


def dequant_fp8(weight, scale_inv, block=(128, 128), dtype=torch.float32) -> torch.Tensor:
    """Torch dequantization of e4m3 [..., N, K] with block scales, on any device."""
    n, k = weight.shape[-2:]
    s = scale_inv.repeat_interleave(block[0], -2)[..., :n, :].repeat_interleave(block[1], -1)
    return (weight.float() * s[..., :k]).to(dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if not bool(out.isfinite().all()):
        return math.inf
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-12))


def _int4(n: int, k: int, device, lead=()):
    packed = torch.randint(
        -(2**31), 2**31 - 1, (*lead, n, k // 8), dtype=torch.int32, device=device
    )
    scale = (torch.rand(*lead, n, k // 32, device=device) * 0.01 + 0.002).bfloat16()
    return packed, scale


def _fp8(n: int, k: int, device, lead=()):
    """Random e4m3 weights (N(0, 64) clamped to ±448) and block scales; one matrix at a time,
    so 384 experts never need a float32 copy of them all (22 GB for Kimi's w13)."""
    weight = torch.empty(*lead, n, k, dtype=torch.float8_e4m3fn, device=device)
    for part in weight.view(-1, n, k):
        part.copy_((torch.randn(n, k, device=device) * 64).clamp_(-448, 448))
    grid = (*lead, -(-n // 128), -(-k // 128))
    return weight, torch.rand(grid, device=device) * 2e-4 + 5e-5


def _guard(checks: list, name: str, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as err:  # one failing case must not end the check
        checks.append({"check": name, "ok": False, "error": repr(err)[:500]})


def _check(name: str, err: float) -> dict:
    return {"check": name, "rel_err": err, "tol": TOL, "ok": err <= TOL}


def _w4a16_case(cfg, device, timed, shape, checks: list, timings: list) -> None:
    from engine.gpu_kernels.w4a16 import w4a16_gemm

    m, k, n = shape
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    packed, scale = _int4(n, k, device)
    ref = x.float() @ dequant_int4(packed, scale, k).T
    checks.append(_check(f"w4a16 {m}x{k}x{n}", rel_err(w4a16_gemm(x, packed, scale), ref)))
    w_bf16 = dequant_int4(packed, scale, k, dtype=torch.bfloat16)

    def dequant_then_matmul():
        return x @ dequant_int4(packed, scale, k, dtype=torch.bfloat16).T

    ms = timed(lambda: w4a16_gemm(x, packed, scale), cfg["iters"])
    timings.append(
        {
            "kernel": "w4a16",
            "m": m,
            "k": k,
            "n": n,
            "kernel_ms": ms,
            "weight_gbs": (packed.nbytes + scale.nbytes) / ms / 1e6,
            "torch_bf16_ms": timed(lambda: x @ w_bf16.T, cfg["iters"]),
            "torch_dequant_ms": timed(dequant_then_matmul, cfg["dequant_iters"]),
        }
    )


def _fp8_case(cfg, device, timed, shape, checks: list, timings: list) -> None:
    from engine.gpu_kernels.fp8_act_quant import (
        quantize_activations_reference,
        quantize_activations_triton,
    )
    from engine.gpu_kernels.fp8_block_gemm import fp8_block_gemm, fp8_block_linear

    m, k, n = shape
    x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    weight, scale_inv = _fp8(n, k, device)
    x_q, x_s = quantize_activations_triton(x)
    ref_q, ref_s = quantize_activations_reference(x)
    same = torch.equal(x_q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(x_s, ref_s)
    on_gpu = device.type == "cuda"
    checks.append({"check": f"fp8 act quant {m}x{k}", "ok": same or not on_gpu,
                   "bit_exact": same if on_gpu else f"{same} (interpreter: not enforced)"})  # fmt: skip
    w_f32 = dequant_fp8(weight, scale_inv)
    ref = (ref_q.float() * ref_s.repeat_interleave(128, 1)[:, :k]) @ w_f32.T
    out = fp8_block_gemm(ref_q, ref_s, weight, scale_inv)
    checks.append(_check(f"fp8 block {m}x{k}x{n}", rel_err(out, ref)))
    w_bf16 = w_f32.bfloat16()

    def dequant_then_matmul():
        return x @ dequant_fp8(weight, scale_inv, dtype=torch.bfloat16).T

    it = cfg["iters"]
    row = {
        "kernel": "fp8_block",
        "m": m,
        "k": k,
        "n": n,
        "kernel_ms": timed(lambda: fp8_block_linear(x, weight, scale_inv), it),
        "gemm_only_ms": timed(lambda: fp8_block_gemm(x_q, x_s, weight, scale_inv), it),
        "act_quant_ms": timed(lambda: quantize_activations_triton(x), it),
        "torch_bf16_ms": timed(lambda: x @ w_bf16.T, it),
        "torch_dequant_ms": timed(dequant_then_matmul, cfg["dequant_iters"]),
    }
    row["weight_gbs"] = (weight.nbytes + scale_inv.nbytes) / row["gemm_only_ms"] / 1e6
    if on_gpu:
        for name in ("rowwise", "tensor"):
            row.update(_scaled_mm_row(name, x, w_bf16, ref, timed, it))
    timings.append(row)


def _scaled_mm_row(name: str, x, w_bf16, ref, timed, iters: int) -> dict:
    """torch._scaled_mm with rowwise or per-tensor scales: time (matmul only) and rel_err."""
    if name == "rowwise":  # per token [M, 1] and per output channel [1, N]
        a_s = x.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 448
        b_s = (w_bf16.float().abs().amax(1, keepdim=True).clamp_min(1e-12) / 448).view(1, -1)
        b_div = b_s.view(-1, 1)
    else:
        a_s = x.float().abs().max() / 448
        b_s = b_div = w_bf16.float().abs().max() / 448
    a = (x.float() / a_s).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = (w_bf16.float() / b_div).clamp(-448, 448).to(torch.float8_e4m3fn)

    def run():
        return torch._scaled_mm(a, b.t(), scale_a=a_s, scale_b=b_s, out_dtype=torch.bfloat16)

    try:
        return {f"scaled_mm_{name}_rel_err": rel_err(run(), ref),
                f"scaled_mm_{name}_ms": timed(run, iters)}  # fmt: skip
    except Exception as err:  # shape or build limits of _scaled_mm: report them
        return {f"scaled_mm_{name}_error": repr(err)[:300]}


def torch_moe(x, ids, weights, expert_weights, act=None) -> torch.Tensor:
    """engine/layers/moe.py's loop: pairs sorted by expert, one host sync, then expert by expert.

    expert_weights(e) -> (w13 [2I, H], w2 [H, I]) in the compute dtype; `act`
    (FP8 experts, reference only) quantizes and dequantizes x and the
    intermediate as the kernel's FP8 activations mean.
    """
    top_k, flat = ids.shape[1], ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat).tolist()
    rows, pair_w = order // top_k, weights.reshape(-1)[order].float()
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    start = 0
    for e, count in enumerate(counts):
        if count == 0:
            continue
        w13, w2 = expert_weights(e)
        r = rows[start : start + count]
        xe = x.index_select(0, r).to(w13.dtype)
        h = (xe if act is None else act(xe)) @ w13.T
        i = w2.shape[1]
        a = (F.silu(h[:, :i]) * h[:, i:]).to(x.dtype).to(w13.dtype)
        y = (a if act is None else act(a)) @ w2.T
        out.index_add_(0, r, y.float() * pair_w[start : start + count, None])
        start += count
    return out.to(x.dtype)


class _ExpertSet:
    """Random experts of one kind for fused_moe, and torch's dequantization of expert j."""

    def __init__(self, kind: str, cfg, device):
        from engine.gpu_kernels.moe_weights import DenseExperts, Fp8BlockExperts, Int4Experts

        self.kind = kind
        e, self.h, self.i = cfg["experts"], cfg["hidden"], cfg["inter"]
        if kind == "bf16":
            bf16 = dict(device=device, dtype=torch.bfloat16)  # filled in place: no temporaries
            self.w13 = torch.empty(e, 2 * self.i, self.h, **bf16).normal_(0, self.h**-0.5)
            self.w2 = torch.empty(e, self.h, self.i, **bf16).normal_(0, self.i**-0.5)
            self.experts = DenseExperts(self.w13, self.w2)
        elif kind == "int4":
            (self.w13, self.s13), (self.w2, self.s2) = (
                _int4(2 * self.i, self.h, device, (e,)),
                _int4(self.h, self.i, device, (e,)),
            )
            self.experts = Int4Experts(self.w13, self.s13, self.w2, self.s2, self.i)
        else:  # gate and up quantized apart, as the checkpoint stores them (moe_weights.py)
            (gate, gate_s), (up, up_s) = (_fp8(self.i, self.h, device, (e,)) for _ in "gu")
            self.w13, self.s13 = torch.cat([gate, up], dim=1), torch.cat([gate_s, up_s], dim=1)
            self.w2, self.s2 = _fp8(self.h, self.i, device, (e,))
            self.experts = Fp8BlockExperts(self.w13, self.s13, self.w2, self.s2)

    def dequantized(self, j: int, dtype=torch.float32):
        if self.kind == "bf16":
            return self.w13[j].to(dtype), self.w2[j].to(dtype)
        if self.kind == "int4":
            return (dequant_int4(self.w13[j], self.s13[j], self.h, dtype=dtype),
                    dequant_int4(self.w2[j], self.s2[j], self.i, dtype=dtype))  # fmt: skip
        i, rows = self.i, self.s13.shape[1] // 2
        gate = dequant_fp8(self.w13[j, :i], self.s13[j, :rows], dtype=dtype)
        up = dequant_fp8(self.w13[j, i:], self.s13[j, rows:], dtype=dtype)
        return torch.cat([gate, up]), dequant_fp8(self.w2[j], self.s2[j], dtype=dtype)

    def bf16(self, j: int):
        return self.dequantized(j, torch.bfloat16)


def _routing(tokens: int, cfg, device):
    scores = torch.rand(tokens, cfg["experts"], device=device)
    weights, ids = scores.topk(cfg["top_k"], dim=1)
    return ids, (weights / weights.sum(1, keepdim=True))


def _fp8_act(v: torch.Tensor) -> torch.Tensor:
    from engine.gpu_kernels.fp8_act_quant import quantize_activations_reference

    q, s = quantize_activations_reference(v)
    return q.float() * s.repeat_interleave(128, 1)[:, : v.shape[1]]


def _moe_case(kind, cfg, device, timed, baseline: list, checks: list, timings: list) -> None:
    """Check at cfg["check_tokens"], then time every cfg["moe_tokens"]; baseline[0]: BF16 experts."""
    from engine.gpu_kernels.fused_moe import fused_moe

    experts = _ExpertSet(kind, cfg, device)
    if kind == "bf16":
        baseline[:] = [experts]  # dequantized at load: the torch baseline for every kind
    tokens = cfg["check_tokens"]
    x = torch.randn(tokens, cfg["hidden"], device=device, dtype=torch.bfloat16)
    ids, weights = _routing(tokens, cfg, device)
    # fp32 products on the dequantized experts; the intermediate rounded to bf16 as the kernel's.
    ref = torch_moe(x, ids, weights, experts.dequantized, _fp8_act if kind == "fp8" else None)
    out = fused_moe(x, ids, weights, experts.experts)
    check = _check(f"fused moe {kind} {tokens} tokens", rel_err(out, ref))
    if kind == "fp8" and device.type != "cuda":
        # The interpreter's float32 -> bf16 cast truncates, so about half the intermediate
        # values differ from torch's by one bf16 ulp before they are re-quantized to e4m3,
        # and many cross an e4m3 rounding midpoint (tests/engine/gpu_kernels check stages).
        check["ok"], check["note"] = True, f"{check['ok']} (interpreter: not enforced)"
    checks.append(check)
    for tokens in cfg["moe_tokens"]:
        timings.append(_moe_timing(experts, baseline, tokens, cfg, device, timed))


def _moe_timing(experts: _ExpertSet, baseline: list, tokens: int, cfg, device, timed) -> dict:
    from engine.gpu_kernels.fused_moe import fused_moe

    x = torch.randn(tokens, cfg["hidden"], device=device, dtype=torch.bfloat16)
    ids, weights = _routing(tokens, cfg, device)
    row = {"kernel": f"fused_moe_{experts.kind}", "tokens": tokens}
    row["kernel_ms"] = timed(lambda: fused_moe(x, ids, weights, experts.experts), cfg["iters"])
    if baseline:
        bf16 = baseline[0].bf16
        row["torch_bf16_ms"] = timed(lambda: torch_moe(x, ids, weights, bf16), cfg["iters"])
    if experts.kind != "bf16":
        row["torch_dequant_ms"] = timed(
            lambda: torch_moe(x, ids, weights, experts.bf16), cfg["dequant_iters"]
        )
    return row


def run_quant(mode: str, device, timer) -> dict:
    """Both sections; timer(fn, iters, warmup) -> median ms. Returns {"checks", "timings", "tol"}."""
    cfg = SIZES[mode]

    def timed(fn, iters: int) -> float:
        return timer(fn, iters, cfg["warmup"])

    checks, timings, baseline = [], [], []
    for shape in cfg["dense"]:
        m, k, n = shape
        _guard(
            checks, f"w4a16 {m}x{k}x{n}", _w4a16_case, cfg, device, timed, shape, checks, timings
        )
        _guard(
            checks, f"fp8 block {m}x{k}x{n}", _fp8_case, cfg, device, timed, shape, checks, timings
        )
    for kind in ("bf16", "fp8", "int4"):
        _guard(checks, f"fused moe {kind}", _moe_case, kind, cfg, device, timed, baseline, checks,
               timings)  # fmt: skip
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"checks": checks, "timings": timings, "tol": TOL}


def table_lines(quant: dict) -> list[str]:
    lines = []
    for r in quant["timings"]:
        shape = f"M={r['m']} {r['k']}x{r['n']}" if "m" in r else f"T={r['tokens']}"
        parts = [f"{r['kernel']:<16} {shape:<18} kernel {r['kernel_ms']:8.3f} ms"]
        for key in (
            "torch_bf16_ms",
            "torch_dequant_ms",
            "scaled_mm_rowwise_ms",
            "scaled_mm_tensor_ms",
        ):
            if key in r:
                parts.append(f"{key.removesuffix('_ms')} {r[key]:.3f}")
        lines.append(", ".join(parts))
    bad = [c["check"] for c in quant["checks"] if not c["ok"]]
    lines.append(f"quantized kernels: {len(quant['checks']) - len(bad)}/{len(quant['checks'])} ok"
                 + (f"; FAILED: {', '.join(bad)}" if bad else ""))  # fmt: skip
    return lines
