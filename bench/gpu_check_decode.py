"""The decode-attention timings of `bench/gpu_check.py` (part 2) and its `--quick` run.

CUDA events with L2 flushed between runs, BF16 against FP8 pages, a device
copy as the bandwidth yardstick, and the FP8 tile sweep. Both entry points
import it from here, so neither imports the other (no import circles,
tests/test_layout_rules.py).
"""

from __future__ import annotations

import gc
import statistics
import time

import torch

from bench.gpu_check_correctness import fill_random_


def timed_ms(fn, device, iters: int, warmup: int, flush: torch.Tensor | None) -> float:
    """Median milliseconds of fn(); CUDA events on a GPU (L2 flushed first), else wall clock."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if flush is not None:
            flush.zero_()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def free_memory(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth(cfg, device) -> float:
    """GB/s of a device-to-device copy (bytes read + bytes written)."""
    n = int(cfg["copy_gib"] * 2**30)
    src, dst = (
        torch.empty(n, dtype=torch.uint8, device=device),
        torch.empty(n, dtype=torch.uint8, device=device),
    )
    src.fill_(1)
    ms = timed_ms(lambda: dst.copy_(src), device, cfg["iters"], cfg["warmup"], None)
    return 2 * n / (ms * 1e-3) / 1e9


def timing_case(kind: str, cfg, storage, tables, batch: int, device, fp8_dot=None):
    """The kernel call to time and the bytes of KV it reads. `fp8_dot`: None is the
    kernels' default (FP8 pages on e4m3 tensor cores), False the widening kernel."""
    from engine.attention.triton.decode import gqa_decode
    from engine.attention.triton.mla_decode import mla_decode

    bf16 = dict(device=device, dtype=torch.bfloat16)
    ctx = tables.max_seq_len
    if kind == "gqa":
        hq, hkv, dim = cfg["gqa"]
        q, ones = torch.randn(batch, hq, dim, **bf16), torch.ones(hkv, device=device)
        out = torch.empty_like(q)
        nbytes = batch * ctx * 2 * hkv * dim * storage.element_size()

        def gqa():
            gqa_decode(q, storage, tables, ones, ones, dim**-0.5, out=out, fp8_dot=fp8_dot)

        return gqa, nbytes
    heads, lora, rope = cfg["mla"]
    q, out = torch.randn(batch, heads, lora + rope, **bf16), torch.empty(batch, heads, lora, **bf16)
    nbytes = batch * ctx * (lora + rope) * storage.element_size()

    def mla():
        mla_decode(q, storage, tables, lora, 1.0, 1.0, 0.07, out=out, fp8_dot=fp8_dot)

    return mla, nbytes


def decode_timings(cfg, device, flush) -> list[dict]:
    """BF16 and FP8 decode at every context and batch; storage sized once for the largest batch."""
    from engine.attention.triton.common import StepTables

    rows = []
    _, hkv, dim = cfg["gqa"]
    _, lora, rope = cfg["mla"]
    page, top = cfg["page"], max(cfg["batches"])
    for kind in ("gqa", "mla"):
        row_shape = (2, hkv, dim) if kind == "gqa" else (lora + rope,)
        for ctx in cfg["contexts"]:
            pages = -(-ctx // page)
            measured = {}
            try:
                for kv, dtype in (("bf16", torch.bfloat16), ("fp8", torch.uint8)):
                    shape = (top * pages * page, *row_shape)
                    storage = fill_random_(torch.empty(shape, dtype=dtype, device=device), 1 / 16)
                    for batch in cfg["batches"]:
                        table = torch.randperm(top * pages)[: batch * pages].view(batch, pages)
                        lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
                        table = table.to(device, torch.int32)
                        tables = StepTables(page, table, lens, lens, lens, ctx, 1)
                        fn, nbytes = timing_case(kind, cfg, storage, tables, batch, device)
                        ms = timed_ms(fn, device, cfg["iters"], cfg["warmup"], flush)
                        measured[batch, kv] = (ms, nbytes / (ms * 1e-3) / 1e9)
                        if kv == "fp8":  # the same pages widened to bf16 (the old kernel)
                            fn, _ = timing_case(kind, cfg, storage, tables, batch, device, False)
                            ms = timed_ms(fn, device, cfg["iters"], cfg["warmup"], flush)
                            measured[batch, "fp8_widen"] = (ms, nbytes / (ms * 1e-3) / 1e9)
                    storage = None
                    free_memory(device)
            except Exception as err:  # report the shape that failed; time the others
                rows.append(dict(kind=kind, context=ctx, error=repr(err)[:500]))
                storage = None
                free_memory(device)
                continue
            for batch in cfg["batches"]:
                (b_ms, b_bw), (f_ms, f_bw) = measured[batch, "bf16"], measured[batch, "fp8"]
                w_ms = measured[batch, "fp8_widen"][0]
                rows.append(dict(kind=kind, context=ctx, batch=batch, bf16_ms=b_ms, fp8_ms=f_ms,
                                 speedup=b_ms / f_ms, bf16_gbs=b_bw, fp8_gbs=f_bw,
                                 fp8_widen_ms=w_ms, e4m3_dot_gain=w_ms / f_ms))  # fmt: skip
    return rows


def tile_sweep(cfg, device, flush) -> list[dict]:
    """FP8 GQA decode (the e4m3 kernel, decode_fp8.py) at the target context under other
    (BLOCK_N, num_warps): tuning data. Below 64 positions a tile, Hopper runs the dots
    on fp16 mma.sync instead of e4m3 wgmma."""
    from engine.attention.triton import decode
    from engine.attention.triton.common import StepTables

    _, hkv, dim = cfg["gqa"]
    ctx, page, rows = cfg["sweep_context"], cfg["page"], []
    pages, top = -(-ctx // page), max(cfg["batches"])
    storage = torch.empty(top * pages * page, 2, hkv, dim, dtype=torch.uint8, device=device)
    fill_random_(storage, 1 / 16)
    default = decode.FP8_BLOCK_N, decode.FP8_NUM_WARPS
    try:
        for block_n, warps in cfg["sweep_tiles"]:
            decode.FP8_BLOCK_N, decode.FP8_NUM_WARPS = block_n, warps
            for batch in cfg["batches"]:
                table = torch.randperm(top * pages)[: batch * pages].view(batch, pages)
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
                tables = StepTables(page, table.to(device, torch.int32), lens, lens, lens, ctx, 1)
                fn, nbytes = timing_case("gqa", cfg, storage, tables, batch, device)
                try:
                    ms = timed_ms(fn, device, cfg["iters"], cfg["warmup"], flush)
                    rows.append(dict(block_n=block_n, warps=warps, batch=batch, context=ctx,
                                     fp8_ms=ms, fp8_gbs=nbytes / (ms * 1e-3) / 1e9))  # fmt: skip
                except Exception as err:
                    rows.append(dict(block_n=block_n, warps=warps, batch=batch, error=repr(err)))
    finally:
        decode.FP8_BLOCK_N, decode.FP8_NUM_WARPS = default
        storage = None
        free_memory(device)
    return rows
