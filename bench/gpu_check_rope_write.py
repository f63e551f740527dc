"""The fused rotary + K/V rotation + KV write (rope_write.py) for bench/gpu_check.py's part 6.

On a GQA model's real shapes (GLM-4.5: 96 query / 8 KV heads of 128, NeoX
rotary on the first 64 dims, FP8 pages with per-head scales and the
Hadamard rotation the FP8 cache runs with by default), the one kernel
against the three steps it replaces: the rotary kernel on q and k,
`HadamardRotation.rotate` over q, k and v, and the KV write.

Checks: q within MAX_Q_STEPS bf16 steps of the unfused q (the kernel sums
the rotation's products in another order, so a value may round one step
apart), and every stored byte equal to torch's quantization of the unfused
K/V or its e4m3 neighbour (`max_code_steps` <= 1). Timings: `kernel_ms`
(the one launch) against `torch_ms` (rotary kernel, the rotation's matmul
and casts, the write kernel). Under TRITON_INTERPRET=1 ("smoke", float32)
the reference quantizes with torch, whose cast is right everywhere; the
interpreter's own e4m3 cast is not (DESIGN.md §3).
"""

from __future__ import annotations

import torch

MAX_Q_STEPS = 1.0
MAX_CODE_STEPS = 1
POSITIONS = 4096


def _ordered_codes(raw: torch.Tensor) -> torch.Tensor:
    """e4m3 bytes as integers in the order of their values (-0 and +0 both 0), so that
    neighbouring values differ by 1."""
    codes = raw.to(torch.int32)
    magnitude = codes & 0x7F
    return torch.where(codes >= 0x80, -magnitude, magnitude)


def _inputs(m: dict, rows: int, dtype, device):
    from engine.kv.rotation import HadamardRotation
    from engine.layers.rotary import RotaryEmbedding, rope_inv_freq

    q_heads, kv_heads = m["heads"]
    dim = m["head_dim"]
    inv_freq, _ = rope_inv_freq(m["rotary"], {"rope_theta": 1e6})
    rotary = RotaryEmbedding(m["rotary"], POSITIONS, inv_freq, m["interleaved"]).to(device)
    qkv = torch.randn(rows, q_heads + 2 * kv_heads, dim, device=device).to(dtype)
    positions = torch.randint(0, POSITIONS, (rows,), device=device)
    slots = torch.randperm(2 * rows, device=device)[:rows]
    # Per-head scales that put each head's largest value near 448, as calibration does.
    kv = qkv[:, q_heads:].float().view(rows, 2, kv_heads, dim)
    scales = (kv.abs().amax(dim=(0, 3)) / 400).clamp_min(1e-6)  # [2, kv_heads]
    return qkv, rotary, HadamardRotation(dim), positions, slots, scales[0], scales[1]


def rope_write_rows(name: str, m: dict, rows: int, dtype, device, timed) -> tuple[dict, dict]:
    """(check, timing) of the fused kernel at `rows` tokens of model `m`."""
    from engine.attention.triton.kv_write import write_gqa
    from engine.attention.triton.rope_write import rope_rotate_write
    from engine.gpu_kernels import layer_ops as kernels
    from engine.kv.quant import quantize_fp8

    qkv, rotary, rotation, positions, slots, k_scales, v_scales = _inputs(m, rows, dtype, device)
    q_heads, kv_heads = m["heads"]
    dim = m["head_dim"]
    split = [q_heads, kv_heads, kv_heads]
    storage = torch.zeros(2 * rows, 2, kv_heads, dim, dtype=torch.uint8, device=device)
    rope_args = (positions, rotary.cos, rotary.sin, rotary.rotary_dim, rotary.interleaved)

    def fused():
        q, k, v = qkv.split(split, dim=1)
        return rope_rotate_write(q, k, v, *rope_args, rotation.block, storage, slots,
                                 k_scales, v_scales)  # fmt: skip

    def unfused(x):
        kernels.rope_(x[:, : q_heads + kv_heads], *rope_args)
        return rotation.rotate(x)

    got_q = fused()
    ref = unfused(qkv.clone())
    ref_q, ref_k, ref_v = ref.split(split, dim=1)
    expected = torch.stack(
        [
            quantize_fp8(ref_k, k_scales.view(1, -1, 1)).view(torch.uint8),
            quantize_fp8(ref_v, v_scales.view(1, -1, 1)).view(torch.uint8),
        ],
        dim=1,
    )
    code_steps = (_ordered_codes(storage[slots]) - _ordered_codes(expected)).abs()
    q_diff = (got_q.float() - ref_q.float()).abs()
    q_steps = q_diff / (2.0**-7 * ref_q.float().abs().clamp_min(1e-30))
    check = dict(
        check=f"rope_write {name} {rows} rows",
        q_exact=bool(torch.equal(got_q, ref_q)),
        q_max_steps=float(q_steps.max()),
        bytes_exact=bool(code_steps.max() == 0),
        bytes_differing=float((code_steps > 0).float().mean()),
        max_code_steps=int(code_steps.max()),
    )
    check["ok"] = check["q_max_steps"] <= MAX_Q_STEPS and check["max_code_steps"] <= MAX_CODE_STEPS

    scratch = qkv.clone()  # rotary in place: values stay bounded (a rotation)

    def three_steps():
        q, k, v = unfused(scratch).split(split, dim=1)
        write_gqa(storage, slots, k, v, k_scales, v_scales)

    kernel_ms, torch_ms = timed(fused), timed(three_steps)
    timing = dict(op="rope_write", model=name, rows=rows, width=dim, kernel_ms=kernel_ms,
                  torch_ms=torch_ms, speedup=torch_ms / kernel_ms)  # fmt: skip
    return check, timing
