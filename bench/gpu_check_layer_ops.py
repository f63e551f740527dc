"""Layer ops for bench/gpu_check.py: the Triton norm, SwiGLU and rotary kernels against torch.

engine/gpu_kernels/layer_ops.py replaces each of a decoder layer's small
operators (several torch launches each) with one kernel, at TorchLayerOps'
rounding points. On real shapes, BF16, at 1, 32 and 256 tokens:

- GLM-4.5: hidden 5120 (norm, residual add + norm), q/k norms over the 96 + 8
  heads of 128 in the fused qkv, SwiGLU of the dense MLP (12288) and of a
  shared expert (1536), NeoX rotary on the first 64 dims of q and k;
- Kimi K2: hidden 7168, the q (1536) and latent (512 of 576) norms, SwiGLU
  18432 and 2048, interleaved rotary on the last 64 of each of 64 heads of
  192 (a strided slice) and on the rope key.

Checks against TorchLayerOps on the same inputs: `exact` (bit-equal) and the
worst element's distance in bf16 steps (`max_steps`: |kernel - torch| over
2^-7 * |value|). On a GPU rotary, SwiGLU and the residual sum are expected
exact (the same IEEE operations, CUDA's own expf); a norm may differ by a
step where its sum of squares, summed in another order, moves a rounding.
`ok` is within two steps everywhere. Timings (CUDA events, medians):
`kernel_ms` against `torch_ms`, TorchLayerOps' several launches. Runs only
on a GPU from gpu_check.py; the "smoke" sizes are for the CPU test of this
module under TRITON_INTERPRET=1 (float32, where the interpreter casts nothing).
"""

from __future__ import annotations

import torch

SIZES = {
    "full": dict(rows=[1, 32, 256], dtype=torch.bfloat16, iters=20,
                 models={"glm-4.5": dict(hidden=5120, heads=(96, 8), head_dim=128, rotary=64,
                                         interleaved=False, norms=(), qk_norm=True,
                                         silu=(12288, 1536)),
                         "kimi-k2": dict(hidden=7168, heads=(64, 1), head_dim=192, rotary=64,
                                         interleaved=True, norms=(1536, 512), qk_norm=False,
                                         silu=(18432, 2048), mla=True)}),
    "smoke": dict(rows=[1, 3], dtype=torch.float32, iters=1,
                  models={"glm-4.5": dict(hidden=40, heads=(4, 2), head_dim=16, rotary=8,
                                          interleaved=False, norms=(), qk_norm=True, silu=(24,)),
                          "kimi-k2": dict(hidden=48, heads=(4, 1), head_dim=24, rotary=8,
                                          interleaved=True, norms=(24, 16), qk_norm=False,
                                          silu=(20,), mla=True)}),
}  # fmt: skip
MAX_STEPS = 2.0  # see the module doc
BF16_STEP = 2.0**-7
MAX_POSITIONS = 4096


def plan(mode: str) -> dict:
    """The shapes of this section (for --dry-run)."""
    s = SIZES[mode]
    return {"rows": s["rows"], "dtype": str(s["dtype"]).removeprefix("torch."),
            "models": s["models"]}  # fmt: skip


def compare(got: torch.Tensor, want: torch.Tensor) -> dict:
    """exact, the worst element in bf16 steps, and the share of elements that differ."""
    got, want = got.float(), want.float()
    if not bool(got.isfinite().all()):
        return {"exact": False, "max_steps": float("inf"), "mismatch": 1.0}
    scale = BF16_STEP * torch.maximum(got.abs(), want.abs()).clamp_min(1e-30)
    diff = (got - want).abs()
    return {"exact": bool(torch.equal(got, want)), "max_steps": float((diff / scale).max()),
            "mismatch": float((diff > 0).float().mean())}  # fmt: skip


def _rotary(m: dict, device):
    from engine.layers.rotary import RotaryEmbedding, rope_inv_freq

    inv_freq, _ = rope_inv_freq(m["rotary"], {"rope_theta": 1e6})
    return RotaryEmbedding(m["rotary"], MAX_POSITIONS, inv_freq, m["interleaved"]).to(device)


def _cases(m: dict, rows: int, dtype, device):
    """(op, width, kernel fn, torch fn) per operator of the model at `rows` tokens.

    Each fn returns the tensors to compare; the kernel ones call the launchers
    as GpuLayerOps does (its dispatch is the unit tests'). In-place rotary
    works on a copy made outside the timed call for the check, in place when
    timed (the values stay bounded: a rotation)."""
    from engine.gpu_kernels import layer_ops as kernels
    from engine.layers.layer_ops import TORCH_LAYER_OPS as ref

    def rand(*shape):
        return torch.randn(*shape, device=device).to(dtype)

    hidden, eps = m["hidden"], 1e-5
    x, residual = rand(rows, hidden), rand(rows, hidden)
    weight = (torch.rand(hidden, device=device) + 0.5).to(dtype)
    cases = [
        ("rms_norm", hidden, lambda: [kernels.rms_norm(x, weight, eps)],
         lambda: [ref.rms_norm(x, weight, eps)]),
        ("add_rms_norm", hidden, lambda: list(kernels.rms_norm(x, weight, eps, residual=residual)),
         lambda: list(ref.add_rms_norm(x, residual, weight, eps))),
    ]  # fmt: skip
    q_heads, kv_heads = m["heads"]
    head_dim = m["head_dim"]
    if m["qk_norm"]:  # GLM: q and k heads of the fused qkv, read in place
        qkv = rand(rows, q_heads + 2 * kv_heads, head_dim)
        qk = qkv[:, : q_heads + kv_heads]
        w_head = (torch.rand(head_dim, device=device) + 0.5).to(dtype)
        cases.append(("rms_norm_heads", head_dim, lambda: [kernels.rms_norm(qk, w_head, eps)],
                      lambda: [ref.rms_norm(qk, w_head, eps)]))  # fmt: skip
    for width in m["norms"]:  # MLA: the q norm, and the latent: a column slice of kv_a
        kv_a = rand(rows, width + 64)
        part = kv_a[:, :width]
        w_part = (torch.rand(width, device=device) + 0.5).to(dtype)
        cases.append((f"rms_norm_{width}", width,
                      lambda p=part, w=w_part: [kernels.rms_norm(p, w, eps)],
                      lambda p=part, w=w_part: [ref.rms_norm(p, w, eps)]))  # fmt: skip
    for width in m["silu"]:
        gate_up = rand(rows, 2 * width) * 4
        cases.append((f"silu_mul_{width}", width, lambda g=gate_up: [kernels.silu_mul(g)],
                      lambda g=gate_up: [ref.silu_mul(g)]))  # fmt: skip
    rotary = _rotary(m, device)
    positions = torch.randint(0, MAX_POSITIONS, (rows,), device=device)
    if m.get("mla"):  # each head's last `rotary` dims, and the one rope key
        heads = rand(rows, q_heads, head_dim)
        targets = [heads[..., head_dim - m["rotary"] :]]
        kv_a = rand(rows, 512 + m["rotary"])
        targets.append(kv_a[:, 512:].unsqueeze(1))
        bases = [heads, kv_a]
    else:  # q and k heads of the fused qkv
        qkv = rand(rows, q_heads + 2 * kv_heads, head_dim)
        targets, bases = [qkv[:, : q_heads + kv_heads]], [qkv]

    def rotated(rotate):
        saved = [b.clone() for b in bases]
        for t in targets:
            rotate(t)
        out = [b.clone() for b in bases]
        for b, s in zip(bases, saved, strict=True):
            b.copy_(s)
        return out

    def kernel_rope(t):
        kernels.rope_(t, positions, rotary.cos, rotary.sin, rotary.rotary_dim, rotary.interleaved)

    def torch_rope(t):
        ref.rope_(t, positions, rotary, None)

    cases.append(("rope", m["rotary"], lambda: rotated(kernel_rope), lambda: rotated(torch_rope)))
    timed_rope = (lambda: [kernel_rope(t) for t in targets],
                  lambda: [torch_rope(t) for t in targets])  # fmt: skip
    return cases, timed_rope


def _guard(checks: list, name: str, fn) -> None:
    try:
        fn()
    except Exception as err:  # one failing case must not end the check
        checks.append({"check": name, "ok": False, "error": repr(err)[:500]})


def _model_rows(name: str, m: dict, rows: int, cfg, device, timed, checks, timings) -> None:
    cases, timed_rope = _cases(m, rows, cfg["dtype"], device)
    for op, width, kernel_fn, torch_fn in cases:
        got, want = kernel_fn(), torch_fn()
        results = [compare(g, w) for g, w in zip(got, want, strict=True)]
        worst = max(results, key=lambda r: r["max_steps"])
        check = dict(check=f"{op} {name} {rows} rows", exact=all(r["exact"] for r in results),
                     max_steps=worst["max_steps"], mismatch=worst["mismatch"],
                     ok=all(r["max_steps"] <= MAX_STEPS for r in results))  # fmt: skip
        checks.append(check)
        if op == "rope":
            kernel_fn, torch_fn = timed_rope
        kernel_ms = timed(kernel_fn, cfg["iters"])
        torch_ms = timed(torch_fn, cfg["iters"])
        timings.append(dict(op=op, model=name, rows=rows, width=width, kernel_ms=kernel_ms,
                            torch_ms=torch_ms, speedup=torch_ms / kernel_ms))  # fmt: skip


def run_layer_ops(mode: str, device, timer) -> dict:
    """timer(fn, iters, warmup) -> median ms. Returns {"checks", "timings", "max_steps"}."""
    cfg = SIZES[mode]

    def timed(fn, iters: int) -> float:
        return timer(fn, iters, 2)

    checks: list[dict] = []
    timings: list[dict] = []
    for name, m in cfg["models"].items():
        for rows in cfg["rows"]:
            _guard(checks, f"layer ops {name} {rows} rows", lambda n=name, m=m, r=rows:
                   _model_rows(n, m, r, cfg, device, timed, checks, timings))  # fmt: skip
            if not m.get("mla"):  # GQA: the fused rotary + rotation + KV write
                _guard(checks, f"rope_write {name} {rows} rows", lambda n=name, m=m, r=rows:
                       _rope_write(n, m, r, cfg, device, timed, checks, timings))  # fmt: skip
    return {"checks": checks, "timings": timings, "max_steps": MAX_STEPS}


def _rope_write(name, m, rows, cfg, device, timed, checks, timings) -> None:
    from bench.gpu_check_rope_write import rope_write_rows

    check, timing = rope_write_rows(name, m, rows, cfg["dtype"], device,
                                    lambda fn: timed(fn, cfg["iters"]))  # fmt: skip
    checks.append(check)
    timings.append(timing)


def table_lines(layer_ops: dict) -> list[str]:
    lines = [
        f"{r['op']:<16} {r['model']:<8} rows {r['rows']:>4}: kernel {r['kernel_ms']:.4f} ms, "
        f"torch {r['torch_ms']:.4f} ms ({r['speedup']:.1f}x)"
        for r in layer_ops["timings"]
    ]
    checks = layer_ops["checks"]
    bad = [c["check"] for c in checks if not c["ok"]]
    exact = sum(1 for c in checks if c.get("exact"))
    lines.append(f"layer ops: {len(checks) - len(bad)}/{len(checks)} ok, {exact} bit-exact"
                 + (f"; FAILED: {', '.join(bad)}" if bad else ""))  # fmt: skip
    return lines
