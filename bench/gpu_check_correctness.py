"""Correctness half of bench/gpu_check.py: Triton kernels against the torch backend.

Large shapes, random data: pools are filled with normal values (bf16) or the
e4m3 bytes of normal values (fp8), pages are assigned at random, and every
kernel writes into a NaN-poisoned output, so a row it skips fails the check.
The reference is the engine's torch backend on the same pool. The write
kernel rewrites the slots torch just wrote; on a GPU its bytes must be
identical (on the interpreter its fp8 cast is known to round wrongly, so
there the comparison is reported, not enforced, and torch's bytes are put
back before attention runs).
"""

from __future__ import annotations

import math

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.mla import MLADims, mla_attention
from engine.attention.torch_backend import TorchAttentionBackend
from engine.kv.mla_pool import MLALatentPool, MLALayout
from engine.kv.pool import PagedKVPool
from engine.kv.quant import quantize_fp8
from engine.kv.sizing import KVLayout

TOL = 2e-2  # max |out - ref| / max |ref|: bf16 outputs, bf16 p·V products, fp32 reference


def fill_random_(storage: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Normal values (bf16), or the e4m3 bytes of N(0,1)/scale (uint8), in chunks (no big temps)."""
    flat = storage.view(-1)
    for start in range(0, flat.numel(), 1 << 28):
        chunk = flat[start : start + (1 << 28)]
        if storage.dtype == torch.uint8:
            values = torch.randn(chunk.numel(), device=chunk.device) / scale
            chunk.copy_(quantize_fp8(values, 1.0).view(torch.uint8))
        else:
            chunk.normal_()
    return storage


def random_slots(lens: list[int], page: int, num_pages: int) -> list[torch.Tensor]:
    free = torch.randperm(num_pages).tolist()
    out = []
    for n in lens:
        pages = torch.tensor([free.pop() for _ in range(-(-n // page))])
        pos = torch.arange(n)
        out.append(pages[pos // page] * page + pos % page)
    return out


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.isnan().any():
        return math.inf
    return (
        (out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6)
    ).item()


def check(name: str, err: float, extra: dict | None = None) -> dict:
    return {"check": name, "rel_err": err, "tol": TOL, "ok": err <= TOL, **(extra or {})}


def guarded(name: str, run, *args) -> dict:
    """run(*args), or a failed check that carries the error: one bad case must not end the run."""
    try:
        return run(*args)
    except Exception as err:  # a compile error or OOM on one shape: report, go on
        return {"check": name, "ok": False, "error": repr(err)[:500]}


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.uint8) if x.element_size() == 1 else x.view(torch.int16)


def _gqa_case(cfg, device, exact_casts, kind, qlens, lens, hq, hkv, dim, kv) -> dict:
    from engine.attention.triton.common import step_tables
    from engine.attention.triton.decode import gqa_decode
    from engine.attention.triton.kv_write import write_gqa
    from engine.attention.triton.prefill import prefill_attention

    page = cfg["page"]
    num_pages = sum(-(-n // page) for n in lens) + 1
    layout = KVLayout(num_layers=1, kind="gqa", num_kv_heads=hkv, head_dim=dim)
    pool = PagedKVPool(layout, num_pages, page, kv, device)
    fill_random_(pool.storage, 1 / 16)
    if pool.is_fp8:
        pool.set_scales(torch.rand(1) / 16 + 1 / 32, torch.rand(1) / 16 + 1 / 32, "check")
    slots = random_slots(lens, page, num_pages)
    new = torch.cat([s[n - q :] for s, q, n in zip(slots, qlens, lens, strict=True)])
    new = new.to(device)
    meta = AttentionMetadata.build(qlens, lens, new, slots, device)
    t = sum(qlens)
    q = torch.randn(t, hq, dim, device=device, dtype=torch.bfloat16) * 2
    k, v = (torch.randn(t, hkv, dim, device=device, dtype=torch.bfloat16) for _ in "kv")
    ref = TorchAttentionBackend().forward(0, q, k, v, pool, meta, dim**-0.5)
    storage, (ks, vs) = pool.storage[0], pool.layer_scales(0)
    stored = storage[new].clone()
    write_gqa(storage, new, k, v, ks, vs)
    same = bool(torch.equal(_bytes(storage[new]), _bytes(stored)))
    storage[new] = stored  # keep torch's bytes for the comparison below
    out = torch.full_like(q, float("nan"))
    args = (q, storage, step_tables(meta, page), ks, vs, dim**-0.5)
    if kind == "decode":  # the widening path, which computes as torch does
        gqa_decode(*args, out=out, fp8_dot=False)
    else:
        prefill_attention(*args, out=out)
    res = check(f"gqa {kind} {kv} {hq}/{hkv}x{dim}", rel_err(out, ref))
    res["write_bit_exact"] = same if exact_casts else f"{same} (interpreter: not enforced)"
    res["ok"] = res["ok"] and (same or not exact_casts)
    if kind == "decode" and pool.is_fp8:
        res.update(_fp8_dot_check(args, meta, lens))
        res["ok"] = res["ok"] and res["fp8_dot_within_bound"]
    return res


def _fp8_dot_check(args, meta, lens) -> dict:
    """FP8 decode on e4m3 tensor cores (the default where the GPU has them) within the
    bound engine.devtools.testing.fp8_decode_bound derives, row by row."""
    from engine.attention.triton.common import choose_fp8_dot
    from engine.attention.triton.decode import gqa_decode
    from engine.devtools.testing.fp8_decode_bound import (
        BF16_OUTPUT_ROUNDING,
        excess_over_bound,
        gqa_reference_and_bound,
    )

    q, storage, _, ks, vs, scale = args
    default = choose_fp8_dot(q, storage, None)
    out = gqa_decode(*args, out=torch.full_like(q, float("nan")), fp8_dot=True)
    excess = -math.inf
    for row, length in enumerate(lens):
        stored = storage[meta.context_slots[row, :length]]
        ref, bound = gqa_reference_and_bound(q[row], stored, ks, vs, scale)
        excess = max(excess, excess_over_bound(out[row], ref, bound, BF16_OUTPUT_ROUNDING))
    within = excess <= 0 and not out.isnan().any().item()
    return {"fp8_dot_default": default, "fp8_dot_excess": excess, "fp8_dot_within_bound": within}


def gqa_checks(cfg, device, exact_casts: bool) -> list[dict]:
    """Decode for every shape in cfg["decode_checks"], prefill for the second; fp8 and bf16."""
    decode = [1] * len(cfg["check_lens"])
    cases = [("decode", decode, cfg["check_lens"], *s) for s in cfg["decode_checks"]]
    cases.append(("prefill", *cfg["prefill"], *cfg["decode_checks"][1]))
    results = []
    for case in cases:
        for kv in ("fp8_e4m3", "bf16"):
            name = f"gqa {case[0]} {kv} {case[3]}/{case[4]}x{case[5]}"
            results.append(guarded(name, _gqa_case, cfg, device, exact_casts, *case, kv))
    return results


def _mla_case(cfg, device, exact_casts, heads, kv) -> dict:
    from engine.attention.triton.backend import TritonAttentionBackend

    _, lora, rope = cfg["mla"]
    lens, page = cfg["check_lens"], cfg["page"]
    dims = MLADims(num_heads=heads, nope_dim=128, rope_dim=rope, v_dim=128, lora_rank=lora)
    layout = MLALayout(num_layers=1, kind="mla", latent_dim=lora + rope, rope_dim=rope)
    num_pages = sum(-(-n // page) for n in lens) + 1
    pools = [MLALatentPool(layout, num_pages, page, kv, device) for _ in range(2)]
    fill_random_(pools[0].storage, 1 / 16)
    pools[1].storage.copy_(pools[0].storage)
    for pool in pools:
        if pool.is_fp8:
            pool.set_scales(torch.tensor([1 / 16]), torch.tensor([1 / 8]), "check")
    slots = random_slots(lens, page, num_pages)
    last = torch.stack([s[-1] for s in slots]).to(device)
    meta = AttentionMetadata.build([1] * len(lens), lens, last, slots, device)
    b, bf = len(lens), dict(device=device, dtype=torch.bfloat16)
    latent, rope_key = torch.randn(b, lora, **bf), torch.randn(b, rope, **bf)
    if pools[0].is_fp8 and not exact_casts:
        # The interpreter's fp8 cast rounds some values wrongly: give it exact ones.
        latent, rope_key = _exact(latent, 1 / 16), _exact(rope_key, 1 / 8)
    args = (
        torch.randn(b, heads, 128, **bf),
        torch.randn(b, heads, rope, **bf),
        latent,
        rope_key,
        torch.randn(heads * 256, lora, **bf) * lora**-0.5,
    )
    ref = mla_attention(0, *args, pools[0], meta, dims, 0.07, path="absorbed")
    backend = TritonAttentionBackend()
    backend.fp8_dot = False  # the widening path, which computes as torch does
    out = mla_attention(0, *args, pools[1], meta, dims, 0.07, backend=backend)
    res = check(f"mla decode {kv} {heads}h {lora}+{rope}", rel_err(out, ref))
    same = bool(torch.equal(_bytes(pools[1].storage[0][last]), _bytes(pools[0].storage[0][last])))
    res["write_bit_exact"] = same
    res["kernel_used"] = backend.mla_decode_calls == 1
    res["ok"] = res["ok"] and same and res["kernel_used"]
    if pools[1].is_fp8:
        res.update(_mla_fp8_dot_check(pools[1], meta, lens, heads, lora, rope))
        res["ok"] = res["ok"] and res["fp8_dot_within_bound"]
    return res


def _mla_fp8_dot_check(pool, meta, lens, heads, lora, rope) -> dict:
    """MLA decode on e4m3 tensor cores (the default where the GPU has them) over the
    stored rows, within engine.devtools.testing.fp8_decode_bound's bound, row by row."""
    from engine.attention.triton.common import choose_fp8_dot, step_tables
    from engine.attention.triton.mla_decode import mla_decode
    from engine.devtools.testing.fp8_decode_bound import (
        BF16_OUTPUT_ROUNDING,
        excess_over_bound,
        mla_reference_and_bound,
    )

    storage = pool.storage[0]
    latent_scale, rope_scale, softmax_scale = 1 / 16, 1 / 8, 0.07
    q = torch.randn(len(lens), heads, lora + rope, device=storage.device, dtype=torch.bfloat16)
    tables = step_tables(meta, pool.page_size)
    out = mla_decode(q, storage, tables, lora, latent_scale, rope_scale, softmax_scale,
                     fp8_dot=True)  # fmt: skip
    excess = -math.inf
    for row, length in enumerate(lens):
        stored = storage[meta.context_slots[row, :length]]
        ref, bound = mla_reference_and_bound(
            q[row], stored, lora, latent_scale, rope_scale, softmax_scale
        )
        excess = max(excess, excess_over_bound(out[row], ref, bound, BF16_OUTPUT_ROUNDING))
    within = excess <= 0 and not out.isnan().any().item()
    return {
        "fp8_dot_default": choose_fp8_dot(q, storage, None),
        "fp8_dot_excess": excess,
        "fp8_dot_within_bound": within,
    }


def mla_checks(cfg, device, exact_casts: bool) -> list[dict]:
    results = []
    _, lora, rope = cfg["mla"]
    for heads in cfg["mla_check_heads"]:
        for kv in ("fp8_e4m3", "bf16"):
            name = f"mla decode {kv} {heads}h {lora}+{rope}"
            results.append(guarded(name, _mla_case, cfg, device, exact_casts, heads, kv))
    return results


def _exact(x: torch.Tensor, scale: float) -> torch.Tensor:
    return (quantize_fp8(x, scale).float() * scale).to(x.dtype)
