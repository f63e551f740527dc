"""One-GPU check of the Triton attention backend (H200): correctness, kernel timings, end to end.

    python bench/gpu_check.py --out gpu_check.json            # the H200 run, under 8 minutes
    python bench/gpu_check.py --quick                         # all parts in 6 minutes, verdicts
    python bench/gpu_check.py --dry-run                       # the plan only: shapes, bytes, splits
    TRITON_INTERPRET=1 python bench/gpu_check.py --smoke      # tiny rehearsal on CPU (tested)

1. Correctness against the torch backend on large shapes with random data:
   the write kernel's bytes (bit-exact on a GPU), GQA decode (groups 1/4/8/12,
   head dims 64/128), prefill over a cached prefix, MLA decode (512+64 latent);
   kernel outputs go into NaN-poisoned buffers, so an unwritten row fails.
2. Decode attention timings with CUDA events (L2 flushed between runs), GLM-4.5
   shapes (96 query / 8 KV heads, 128 dims) and Kimi's MLA (64 heads), at 8k,
   32k and 128k context for batch 1, 16 and 64, BF16 against FP8 pages; the
   achieved bandwidth is compared with a device copy measured in the same run.
   Targets: FP8 at least 1.6x faster than BF16 at 32k, at least 60% of copy.
   Then FP8 decode at 32k under other tile sizes (BLOCK_N, warps): tuning data.
3. Quantized-weight kernels (bench/gpu_check_quant.py): W4A16, FP8-block GEMM
   and the fused MoE (BF16/FP8/INT4 experts) on Kimi shapes, checked against
   torch and timed against torch's dequantize-then-matmul and _scaled_mm.
   `--quant-only` runs this part alone; `--skip-quant` leaves it out.
4. End-to-end decode tokens/s of mid-size random GLM-MoE and Kimi (MLA) models.
5. Tensor parallelism (bench/gpu_check_tp.py): the same models with TP 1, 2, 4, 8
   as far as the visible GPUs go (TP 1 only on one GPU): tokens against TP 1 and
   decode tokens/s. `--skip-tp` leaves it out; it starts only within the budget.
6. Layer ops (bench/gpu_check_layer_ops.py), GPU only: the Triton norm (with the
   residual add), SwiGLU and rotary kernels against TorchLayerOps on GLM-4.5 and
   Kimi shapes at 1, 32 and 256 tokens, bit-exactness reported, both timed; and
   the fused rotary + rotation + KV write against its three steps
   (bench/gpu_check_rope_write.py).
   `--layer-ops-only` runs this part alone; `--skip-layer-ops` leaves it out.
Prints a table last and writes JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from bench.gpu_check_correctness import fill_random_, gqa_checks, mla_checks  # noqa: E402
from bench.gpu_check_layer_ops import plan as layer_ops_plan  # noqa: E402
from bench.gpu_check_quant import plan as quant_plan  # noqa: E402
from bench.gpu_check_quant import run_quant, table_lines  # noqa: E402

FULL = dict(
    contexts=[8192, 32768, 131072],
    batches=[1, 16, 64],
    gqa=(96, 8, 128),
    mla=(64, 512, 64),
    page=16,
    iters=20,
    warmup=3,
    copy_gib=4.0,
    decode_checks=[(8, 8, 128), (32, 8, 128), (64, 8, 128), (96, 8, 128), (32, 4, 64)],
    check_lens=[32768, 1, 20011, 4097],
    prefill=([512, 1, 300], [4608, 2001, 300]),
    mla_check_heads=[16, 64],
    e2e_batch=32,
    e2e_prompt=2048,
    e2e_tokens=64,
    sweep_context=32768,
    sweep_tiles=[(64, 4), (64, 8), (128, 4), (128, 8)],
)
SMOKE = dict(
    contexts=[40],
    batches=[1, 3],
    gqa=(8, 2, 16),
    mla=(4, 32, 16),
    page=4,
    iters=2,
    warmup=1,
    copy_gib=0.001,
    decode_checks=[(2, 2, 16), (8, 2, 16), (8, 1, 32)],
    check_lens=[37, 1, 16],
    prefill=([20, 1, 7], [29, 9, 7]),
    mla_check_heads=[4, 20],
    e2e_batch=2,
    e2e_prompt=12,
    e2e_tokens=3,
    e2e_runs=[("triton", "fp8_e4m3", False), ("triton", "fp8_e4m3", True)],
    sweep_context=40,
    sweep_tiles=[(16, 4), (32, 4)],
)
TARGET_SPEEDUP, TARGET_BANDWIDTH, TARGET_CONTEXT = 1.6, 0.60, 32768


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


def _timing_case(kind: str, cfg, storage, tables, batch: int, device, fp8_dot=None):
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
                        fn, nbytes = _timing_case(kind, cfg, storage, tables, batch, device)
                        ms = timed_ms(fn, device, cfg["iters"], cfg["warmup"], flush)
                        measured[batch, kv] = (ms, nbytes / (ms * 1e-3) / 1e9)
                        if kv == "fp8":  # the same pages widened to bf16 (the old kernel)
                            fn, _ = _timing_case(kind, cfg, storage, tables, batch, device, False)
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
                fn, nbytes = _timing_case("gqa", cfg, storage, tables, batch, device)
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


def plan(cfg, device_sms: int = 132) -> dict:
    """Shapes, bytes and split plans of the timing runs (what --dry-run prints)."""
    from engine.attention.triton.common import plan_splits

    hq, hkv, dim = cfg["gqa"]
    mh, lora, rope = cfg["mla"]
    runs = []
    for ctx in cfg["contexts"]:
        for batch in cfg["batches"]:
            gqa_bf16 = batch * ctx * 2 * hkv * dim * 2
            mla_bf16 = batch * ctx * (lora + rope) * 2
            runs.append(
                {
                    "context": ctx,
                    "batch": batch,
                    "gqa_bf16_bytes": gqa_bf16,
                    "gqa_fp8_bytes": gqa_bf16 // 2,
                    "gqa_splits": plan_splits(batch * hkv, ctx, 32, device_sms),
                    "mla_bf16_bytes": mla_bf16,
                    "mla_splits": plan_splits(batch * -(-mh // 16), ctx, 32, device_sms),
                }
            )
    largest = max(cfg["contexts"]) * max(cfg["batches"]) * 2 * hkv * dim * 2  # bf16 GQA storage
    return {
        "gqa": {"q_heads": hq, "kv_heads": hkv, "head_dim": dim},
        "mla": {"heads": mh, "lora": lora, "rope": rope},
        "page_size": cfg["page"],
        "runs": runs,
        "largest_storage_bytes": largest,
        "decode_checks": cfg["decode_checks"],
        "check_lens": cfg["check_lens"],
    }


def targets(rows: list[dict], copy_gbs: float) -> list[dict]:
    out = []
    for r in rows:
        if r["kind"] == "gqa" and r["context"] == TARGET_CONTEXT and "error" not in r:
            out.append(
                {
                    "batch": r["batch"],
                    "speedup": r["speedup"],
                    "speedup_ok": r["speedup"] >= TARGET_SPEEDUP,
                    "fp8_bandwidth_fraction": r["fp8_gbs"] / copy_gbs,
                    "bandwidth_ok": r["fp8_gbs"] / copy_gbs >= TARGET_BANDWIDTH,
                }
            )
    return out


def table(result: dict) -> str:
    copy = result.get("copy_gbs", float("nan"))  # absent with --quant-only
    lines = [
        f"copy bandwidth {copy:,.0f} GB/s on {result['env']['device']}",
        f"{'kind':<5}{'ctx':>8}{'batch':>6}{'bf16 ms':>10}{'fp8 ms':>10}{'x':>6}{'fp8 GB/s':>10}"
        f"{'% copy':>8}{'widened ms':>12}",
    ]
    if "decode" not in result:
        lines = [f"on {result['env']['device']}"]
    for r in result.get("decode", []):
        if "error" in r:
            lines.append(f"{r['kind']:<5}{r['context']:>8}  error: {r['error'][:80]}")
            continue
        lines.append(
            f"{r['kind']:<5}{r['context']:>8}{r['batch']:>6}{r['bf16_ms']:>10.3f}{r['fp8_ms']:>10.3f}"
            f"{r['speedup']:>6.2f}{r['fp8_gbs']:>10,.0f}{100 * r['fp8_gbs'] / copy:>7.0f}%"
            f"{r['fp8_widen_ms']:>12.3f}"
        )
    best = {}
    for r in result.get("decode_tile_sweep", []):
        if "fp8_gbs" in r and r["fp8_gbs"] > best.get(r["batch"], {}).get("fp8_gbs", -1):
            best[r["batch"]] = r
    for _, r in sorted(best.items()):
        lines.append(
            f"best fp8 tile, batch {r['batch']} at {r['context']}: BLOCK_N {r['block_n']}, "
            f"{r['warps']} warps, "
            f"{r['fp8_ms']:.3f} ms, {r['fp8_gbs']:,.0f} GB/s"
        )
    for r in result.get("e2e", []):
        lines.append(
            f"e2e {r['model']:<9}{r.get('backend', ''):<7}{r.get('kv', ''):<9}"
            + (
                f"{r['decode_tok_s']:>10,.0f} tok/s"
                if "decode_tok_s" in r
                else f" {r.get('error')}"
            )
        )
    if "quant" in result:
        lines.extend(table_lines(result["quant"]))
    if "layer_ops" in result:
        from bench.gpu_check_layer_ops import table_lines as layer_ops_lines

        lines.extend(layer_ops_lines(result["layer_ops"]))
    checks = result.get("correctness", [])
    bad = [c["check"] for c in checks if not c["ok"]]
    lines.append(
        f"correctness: {len(checks) - len(bad)}/{len(checks)} ok"
        + (f"; FAILED: {', '.join(bad)}" if bad else "")
    )
    for t in result.get("targets", []):
        lines.append(
            f"target @32k batch {t['batch']}: speedup {t['speedup']:.2f} (>= {TARGET_SPEEDUP}: "
            f"{t['speedup_ok']}), {100 * t['fp8_bandwidth_fraction']:.0f}% of copy "
            f"(>= {100 * TARGET_BANDWIDTH:.0f}%: {t['bandwidth_ok']})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="gpu_check.json", help="where to write the JSON results")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; run nothing")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny shapes (CPU: TRITON_INTERPRET=1)"
    )
    parser.add_argument("--skip-e2e", action="store_true", help="kernels only")
    parser.add_argument("--skip-quant", action="store_true", help="no quantized-weight kernels")
    parser.add_argument("--skip-tp", action="store_true", help="no tensor-parallel section")
    parser.add_argument(
        "--quant-only", action="store_true", help="only the quantized-weight kernels (part 3)"
    )
    parser.add_argument(
        "--layer-ops-only", action="store_true", help="only the layer-op kernels (part 6, GPU)"
    )
    parser.add_argument("--skip-layer-ops", action="store_true", help="no layer-op kernels")
    parser.add_argument(
        "--budget-s", type=float, default=400.0, help="no e2e run starts after this many seconds"
    )
    parser.add_argument("--quick", action="store_true", help="bench/gpu_check_quick.py's run")
    args = parser.parse_args(argv)
    if args.quick:
        from bench.gpu_check_quick import run_quick

        return run_quick(args.out)
    cfg = SMOKE if args.smoke else FULL
    mode = "smoke" if args.smoke else "full"
    if args.dry_run:
        print(json.dumps({**plan(cfg), "quant": quant_plan(mode),
                          "layer_ops": layer_ops_plan("full")}, indent=1, default=str))  # fmt: skip
        return 0
    started = time.monotonic()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and not args.smoke:
        parser.error("no GPU here: use --smoke (with TRITON_INTERPRET=1) or --dry-run")
    if device.type == "cpu" and args.layer_ops_only:
        parser.error("--layer-ops-only times the kernels on a GPU; there is none here")
    only = args.quant_only or args.layer_ops_only  # one part alone
    import triton

    from engine.attention.triton import interpreting

    if device.type == "cpu" and not interpreting():
        parser.error("--smoke on CPU needs TRITON_INTERPRET=1")
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    env = {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "interpreter": interpreting(),
        "seed": seed,
    }
    flush = (
        torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
        if device.type == "cuda"
        else None
    )
    result = {"env": env, "mode": mode, "plan": plan(cfg)}

    def timed(fn, iters: int, warmup: int) -> float:
        return timed_ms(fn, device, iters, warmup, flush)

    if not only:
        exact = device.type == "cuda"
        result["correctness"] = gqa_checks(cfg, device, exact) + mla_checks(cfg, device, exact)
        result["copy_gbs"] = copy_bandwidth(cfg, device)
        result["decode"] = decode_timings(cfg, device, flush)
        result["targets"] = targets(result["decode"], result["copy_gbs"])
        result["decode_tile_sweep"] = tile_sweep(cfg, device, flush)
    if not (args.skip_quant or args.layer_ops_only):
        result["quant"] = run_quant(mode, device, timed)
        free_memory(device)
    # On a GPU only: on CPU the interpreter would time numpy, and `make test` stays fast.
    if device.type == "cuda" and not (args.skip_layer_ops or args.quant_only):
        from bench.gpu_check_layer_ops import run_layer_ops

        result["layer_ops"] = run_layer_ops("full", device, timed)
        free_memory(device)
    if args.skip_e2e or only:
        result["e2e"] = []
    else:
        from bench.gpu_check_e2e import run_e2e

        result["e2e"] = run_e2e(cfg, device, started + args.budget_s, mode)
    if device.type == "cuda" and not (args.skip_tp or only):
        if time.monotonic() - started < args.budget_s:
            from bench.gpu_check_tp import run_tp

            free_memory(device)
            result["tp"] = run_tp(smoke=False)
        else:
            result["tp"] = [{"error": "skipped: time budget"}]
    result["elapsed_s"] = time.monotonic() - started
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(result))
    checks = result.get("correctness", []) + result.get("quant", {}).get("checks", [])
    checks += result.get("layer_ops", {}).get("checks", [])
    return 0 if all(c["ok"] for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
