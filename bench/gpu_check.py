"""One-GPU check of the Triton attention backend (H200): correctness, kernel timings, end to end.

    python bench/gpu_check.py --out gpu_check.json            # the H200 run, under 8 minutes
    python bench/gpu_check.py --quick                         # all parts in 6 minutes, verdicts
    python bench/gpu_check.py --dry-run                       # the plan only: shapes, bytes, splits
    TRITON_INTERPRET=1 python bench/gpu_check.py --smoke      # tiny rehearsal on CPU (tested)

1. Correctness against the torch backend on large shapes with random data:
   the write kernel's bytes (bit-exact on a GPU), GQA decode (groups 1/4/8/12,
   head dims 64/128), prefill over a cached prefix, MLA decode (512+64 latent),
   DSA decode (GLM-5's indexer scores and sparse MLA decode: gpu_check_dsa);
   kernel outputs go into NaN-poisoned buffers, so an unwritten row fails.
2. Decode attention timings (bench/gpu_check_decode.py) with CUDA events (L2 flushed between runs), GLM-4.5
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
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

from bench.gpu_check_correctness import gqa_checks, mla_checks  # noqa: E402
from bench.gpu_check_decode import (  # noqa: E402
    copy_bandwidth,
    decode_timings,
    free_memory,
    tile_sweep,
    timed_ms,
)
from bench.gpu_check_dsa import dsa_checks  # noqa: E402
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
        result["correctness"] += dsa_checks(cfg, device)
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
