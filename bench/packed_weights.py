"""Packed FP8-block and INT4 weights against dequantizing them at load; prints JSON.

    python bench/packed_weights.py                 # tiny-but-wide Kimi K2 and GLM-4.5 MoE
    python bench/packed_weights.py --quick         # the test suite's tiny sizes, a smoke run
    python bench/packed_weights.py --dir /tmp/ck   # keep (and reuse) the generated checkpoints

For each generated checkpoint (engine/devtools/testing writes Kimi K2's and GLM-4.5's
real FP8-block and INT4-experts layouts) the engine is loaded twice in one
process, `LLM(path, dtype="bfloat16", quantized_weights="packed")` and
`"dequantized"`, and reports:

- weight bytes held (`llm.stats()["weight_bytes"]`) against the checkpoint's:
  its file bytes, and its bytes at release precision (the generator saves
  unquantized tensors in float32 where releases store BF16; counted here at
  2 bytes each), plus what a dense BF16 copy of the packed layers would hold;
- decode tokens per second at batch 1 and 8: the best of `--repeats` timed
  runs of `max_tokens` new tokens minus the best of one-token runs (which
  leaves the prefill out), the two loads taking turns run by run so a noisy
  neighbour's bursts fall on both alike. The ratio is what to read.

It also measures the kernels alone on a [1024, 1024] weight: their error on
one product (Gaussian BF16 activations, 8 rows) against the exact product in
float64, beside the error of the dequantized BF16 weights that
`quantized_weights="dequantized"` multiplies with, and their time against
torch's BF16 product of the dequantized weight.

Both loads are then compared with a float32 load (exact checkpoint weights,
float32 KV cache), teacher-forced on text the float32 load samples, with the
KV cache in BF16 so that the weights' part shows: the mean absolute change of
each position's log-likelihood and the top-1 agreement. The dequantized loads hold
every quantized layer as a dense BF16 matrix (`linear_methods` shows it).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

WIDE = dict(
    # transformers' usual init scale; the test suite's 0.1 makes activations of a
    # 1024-wide random model grow layer by layer until any rounding flips the logits
    initializer_range=0.02,
    hidden_size=1024,
    intermediate_size=2048,
    moe_intermediate_size=512,
    n_routed_experts=16,
    num_experts_per_tok=4,
    num_hidden_layers=4,
    num_attention_heads=8,
)
KIMI_WIDE = dict(
    WIDE,
    num_key_value_heads=8,
    q_lora_rank=512,
    kv_lora_rank=256,
    qk_nope_head_dim=64,
    qk_rope_head_dim=32,
    v_head_dim=64,
)
GLM_WIDE = dict(WIDE, num_key_value_heads=4, head_dim=128)
CASES = [
    ("kimi_k2", "fp8_block"),
    ("kimi_k2", "int4_experts"),
    ("glm4_moe", "fp8_block"),
    ("glm4_moe", "int4_experts"),
]
QUANTIZED_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape", "weight_scale_inv")


def make(family: str, quantization: str, folder: Path, quick: bool) -> Path:
    """The checkpoint (reused when `folder` holds it already)."""
    import engine.devtools.testing.quantized as quantized
    from engine.devtools.testing.checkpoints import make_checkpoint
    from engine.weights.int4_packed import pack_int4

    path = folder / f"{family}-{quantization}" / "model"
    if (path / "config.json").is_file():
        return path
    # The generator's reference packer loops in Python per value (minutes at these
    # sizes); the engine's vectorized one writes the same words (checked here).
    sample = torch.randint(-8, 8, (3, 40), generator=torch.Generator().manual_seed(0))
    assert torch.equal(pack_int4(sample), quantized.pack_int4_reference(sample))
    reference_packer = quantized.pack_int4_reference
    quantized.pack_int4_reference = pack_int4
    try:
        overrides = {} if quick else KIMI_WIDE if family == "kimi_k2" else GLM_WIDE
        return make_checkpoint(family, path, quantization=quantization, **overrides).path
    finally:
        quantized.pack_int4_reference = reference_packer


def checkpoint_bytes(path: Path) -> dict:
    """File bytes, and bytes with unquantized tensors at BF16 (as releases store them)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    release = 0
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                part = handle.get_slice(name)
                count = 1
                for size in part.get_shape():
                    count *= size
                quantized = name.endswith(QUANTIZED_SUFFIXES) or part.get_dtype() == "F8_E4M3"
                width = torch.empty(0, dtype=_DTYPES[part.get_dtype()]).element_size()
                release += count * (width if quantized else 2)
    return {"file_bytes": sum(f.stat().st_size for f in files), "release_bytes": release}


_DTYPES = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F8_E4M3": torch.float8_e4m3fn,
    "I32": torch.int32,
    "I64": torch.int64,
}


def dense_bf16_bytes(llm) -> int:
    """The weight bytes held if every packed layer were a dense BF16 matrix instead."""
    from engine.layers.linear_methods import MethodLinear
    from engine.layers.packed_methods import is_packed_method

    held = llm.stats()["weight_bytes"]
    for module in llm.engine.model.modules():
        if isinstance(module, MethodLinear) and is_packed_method(module.method):
            held += module.in_features * module.out_features * 2 - module.weight_bytes()
    return held


def load(path: Path, mode: str, dtype: str = "bfloat16", kv_cache_dtype: str | None = None):
    from engine import LLM
    from engine.kv.calibration import calibrate_without_fixed_scales

    start = time.perf_counter()
    llm = LLM(
        str(path),
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        quantized_weights=mode,
        enable_prefix_caching=False,
        kv_memory_gib=0.25,
    )
    seconds = time.perf_counter() - start
    calibrate_without_fixed_scales(llm)
    return llm, seconds


def decode_rates(llms: dict, batches: list[int], max_tokens: int, repeats: int) -> dict:
    """Decode tokens/s per load and batch, the loads taking turns run by run."""
    from engine import SamplingParams

    prompts = [[(7 * i + 3 * j) % 250 + 10 for j in range(16)] for i in range(max(batches))]
    full = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    one = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    best = {(name, b, n): float("inf") for name in llms for b in batches for n in (1, max_tokens)}
    for llm in llms.values():
        llm.generate(prompts[:1], full)  # warm-up, untimed
    for _ in range(repeats):
        for batch in batches:
            for params in (full, one):
                for name, llm in llms.items():
                    begin = time.perf_counter()
                    llm.generate(prompts[:batch], params)
                    key = (name, batch, params.max_tokens)
                    best[key] = min(best[key], time.perf_counter() - begin)
    rates = {}
    for name in llms:
        for batch in batches:
            decode = best[(name, batch, max_tokens)] - best[(name, batch, 1)]
            rates[f"{name}_batch{batch}_tok_s"] = round(batch * (max_tokens - 1) / decode, 1)
    for batch in batches:
        packed, dense = (
            rates[f"packed_batch{batch}_tok_s"],
            rates[f"dequantized_batch{batch}_tok_s"],
        )
        rates[f"ratio_batch{batch}"] = round(packed / dense, 3)
    return rates


def teacher_forced(llms: dict, reference, continuation: int = 48) -> dict:
    """Each load's log-likelihoods against the reference's on the same token sequences.

    The reference samples `continuation` tokens after each of 8 prompts (seeded,
    temperature 1), then every load scores the whole sequences (prompt logprobs):
    the mean absolute change of each position's log-likelihood, and how often the
    load's most likely next token is the reference's."""
    from engine import SamplingParams

    prompts = [[(7 * i + 3 * j) % 250 + 10 for j in range(16)] for i in range(8)]
    sequences = [
        prompt + out.outputs[0].token_ids
        for i, prompt in enumerate(prompts)
        for out in reference.generate(
            [prompt], SamplingParams(max_tokens=continuation, temperature=1.0, seed=i)
        )
    ]
    score = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)

    def scored(llm) -> list:
        return [p for o in llm.generate(sequences, score) for p in o.prompt_logprobs[1:]]

    want = scored(reference)
    result = {"positions": len(want)}
    for name, llm in llms.items():
        got = scored(llm)
        change = sum(abs(g.logprob - w.logprob) for g, w in zip(got, want, strict=True))
        same = sum(next(iter(g.top)) == next(iter(w.top)) for g, w in zip(got, want, strict=True))
        result[name] = {
            "mean_abs_logprob_change": round(change / len(want), 5),
            "top1_agreement": round(same / len(want), 4),
        }
    return result


def packed_breakdown(llm) -> dict:
    """Bytes of the packed layers' quantized values, their scales, and everything else."""
    from engine.layers.linear_methods import MethodLinear
    from engine.layers.packed_methods import Fp8BlockMethod, Int4GroupMethod

    values = scales = 0
    for module in llm.engine.model.modules():
        if isinstance(module, MethodLinear) and isinstance(module.method, Fp8BlockMethod):
            values += module.weight.numel()
            scales += module.weight_scale.numel() * 4
        elif isinstance(module, MethodLinear) and isinstance(module.method, Int4GroupMethod):
            values += module.weight_packed.numel() * 4
            scales += module.weight_scale.numel() * 2
    other = llm.stats()["weight_bytes"] - values - scales
    return {"quantized_values": values, "scales": scales, "other_parameters": other}


def kernel_accuracy(rows: int = 8, cols: int = 1024, out: int = 1024) -> dict:
    """Relative RMS error against float64 products of the exact weights (float32 outputs)."""
    from engine.cpu_kernels.packed_matmul import fp8_block_matmul, int4_matmul, tile_rows
    from engine.weights.fp8_block_format import dequantize_fp8_block, quantize_fp8_block
    from engine.weights.int4_packed import pack_int4

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=gen).bfloat16()

    def error(got: torch.Tensor, exact: torch.Tensor) -> float:
        return float((got.double() - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())

    def bf16_weights(weight: torch.Tensor) -> torch.Tensor:  # the dequantized load's product
        return torch.nn.functional.linear(x.float(), weight.bfloat16().float())

    values = torch.randint(-8, 8, (out, cols), generator=gen)
    scales = (torch.rand(out, cols // 32, generator=gen) * 0.01 + 0.005).bfloat16()
    weight = values.double() * scales.double().repeat_interleave(32, dim=1)
    exact = x.double() @ weight.T
    words, tiled = tile_rows(pack_int4(values)), tile_rows(scales)
    f32 = torch.float32
    int4 = {
        "packed_int8_activations": error(int4_matmul(x, words, tiled, 32, None, f32), exact),
        "packed_float": error(int4_matmul(x, words, tiled, 32, None, f32, False), exact),
        "dequantized_bf16": error(bf16_weights(weight), exact),
    }
    fp8_values, scale_inv = quantize_fp8_block(torch.randn(out, cols, generator=gen) * 0.02)
    weight = dequantize_fp8_block(fp8_values, scale_inv, dtype=torch.float32).double()
    exact = x.double() @ weight.T
    fp8 = {  # the checkpoint's 128x128 grid, as the engine's aligned layers hold it
        "packed": error(fp8_block_matmul(x, fp8_values, scale_inv, 0, 128, 128, None, f32), exact),
        "dequantized_bf16": error(bf16_weights(weight), exact),
    }
    return {"shape": [rows, cols, out], "int4_group32": int4, "fp8_block128": fp8}


def _best_us(fn, calls: int = 20, rounds: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return round(best, 1)


def kernel_speed(cols: int = 1024, out: int = 1024, rows_list=(1, 2, 8, 32)) -> list[dict]:
    """Microseconds per product: the packed kernels against torch's BF16 product of the
    dequantized weight (and, for FP8, C dequantization then that product: the path
    beyond FP8_KERNEL_ROWS), in one process, best of several batches of calls."""
    from functools import partial

    import torch.nn.functional as F

    from engine.cpu_kernels.packed_matmul import (
        fp8_block_dequantize,
        fp8_block_matmul,
        int4_matmul,
        tile_rows,
    )
    from engine.weights.fp8_block_format import quantize_fp8_block
    from engine.weights.int4_packed import pack_int4

    gen = torch.Generator().manual_seed(1)
    values = torch.randint(-8, 8, (out, cols), generator=gen)
    scales = (torch.rand(out, cols // 32, generator=gen) * 0.01 + 0.005).bfloat16()
    int4_dense = (values.float() * scales.float().repeat_interleave(32, dim=1)).bfloat16()
    words, tiled = tile_rows(pack_int4(values)), tile_rows(scales)
    fp8, scale_inv = quantize_fp8_block(torch.randn(out, cols, generator=gen) * 0.02)
    fp8_dense = fp8_block_dequantize(fp8, scale_inv, 0, 128, 128, torch.bfloat16)

    def fp8_then_torch(x):
        return F.linear(x, fp8_block_dequantize(fp8, scale_inv, 0, 128, 128, torch.bfloat16))

    results = []
    for rows in rows_list:
        x = torch.randn(rows, cols, generator=gen).bfloat16()
        results.append(
            {
                "rows": rows,
                "int4_int8_us": _best_us(partial(int4_matmul, x, words, tiled, 32)),
                "int4_float_us": _best_us(
                    partial(int4_matmul, x, words, tiled, 32, None, None, False)
                ),
                "int4_torch_bf16_us": _best_us(partial(F.linear, x, int4_dense)),
                "fp8_kernel_us": _best_us(
                    partial(fp8_block_matmul, x, fp8, scale_inv, 0, 128, 128)
                ),
                "fp8_c_dequantize_then_torch_us": _best_us(partial(fp8_then_torch, x)),
                "fp8_torch_bf16_us": _best_us(partial(F.linear, x, fp8_dense)),
            }
        )
    return results


def run_case(family, quantization, folder, quick, batches, max_tokens, repeats) -> dict:
    path = make(family, quantization, folder, quick)
    sizes = checkpoint_bytes(path)
    llms, result = {}, {"family": family, "quantization": quantization, **sizes}
    for mode in ("packed", "dequantized"):
        llm, seconds = load(path, mode)
        llms[mode] = llm
        stats = llm.stats()
        result[mode] = {
            "weight_bytes": stats["weight_bytes"],
            "to_release_bytes": round(stats["weight_bytes"] / sizes["release_bytes"], 4),
            "linear_methods": stats["linear_methods"],
            "cpu_kernel": llm.engine.cpu_kernel,
            "load_s": round(seconds, 2),
        }
    result["dense_bf16_weight_bytes"] = dense_bf16_bytes(llms["packed"])
    result["packed_to_dense_bf16"] = round(
        result["packed"]["weight_bytes"] / result["dense_bf16_weight_bytes"], 4
    )
    result["packed_breakdown"] = packed_breakdown(llms["packed"])
    result["decode"] = decode_rates(llms, batches, max_tokens, repeats)
    # Accuracy with the KV cache in the activations' dtype, so the weights' part shows;
    # the reference is float32 throughout: the checkpoint's exact function.
    llms.clear()
    accuracy = {mode: load(path, mode, "bfloat16", "auto")[0] for mode in ("packed", "dequantized")}
    reference = load(path, "packed", "float32", "auto")[0]
    result["teacher_forced_vs_float32"] = teacher_forced(accuracy, reference)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="where the checkpoints are written (kept)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few tokens")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--case", action="append", help="family:quantization (default: all)")
    args = parser.parse_args()
    cases = [tuple(c.split(":")) for c in args.case] if args.case else CASES
    max_tokens, repeats = (8, 1) if args.quick else (args.max_tokens, args.repeats)
    from engine.cpu_kernels.library import unavailable

    report = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "threads": torch.get_num_threads(),
            "cpu_kernels": unavailable() or "available",
            "torch": torch.__version__,
        },
        "sizes": "test-suite tiny" if args.quick else {"kimi_k2": KIMI_WIDE, "glm4_moe": GLM_WIDE},
        "max_tokens": max_tokens,
        "repeats": repeats,
        "kernel_accuracy": kernel_accuracy(),
        "kernel_speed": {"shape": [1024, 1024], "products": kernel_speed()},
        "cases": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.dir or Path(scratch)
        for family, quantization in cases:
            report["cases"].append(
                run_case(family, quantization, folder, args.quick, [1, 8], max_tokens, repeats)
            )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
