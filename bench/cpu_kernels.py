"""The CPU C kernels against the torch code they replace; prints JSON.

    python bench/cpu_kernels.py            # the default model's shapes: decode and prefill
    python bench/cpu_kernels.py --quick    # tiny shapes, a few repeats (CI smoke test)

Each entry is the best of several timed batches of calls (microseconds per
call), engine kernel and torch reference measured in the same process, so
their ratio is what to read: this machine's absolute speed drifts.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from functools import partial

import torch
import torch.nn.functional as F


def best_us(fn, calls: int, rounds: int = 5) -> float:
    for _ in range(max(3, calls // 10)):
        fn()
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return round(best, 2)


def grid_products(rows_list, shapes, calls) -> list[dict]:
    from engine.cpu_kernels.grid_matmul import grid_matmul, pack_codes

    gen = torch.Generator().manual_seed(0)
    results = []
    for n, k in shapes:
        codes = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
        step = torch.rand(n, k // 32, 1, generator=gen) * 0.01
        low = -8 * step
        dense = (codes * step + low).reshape(n, k).bfloat16()
        packed, scales = pack_codes(codes, step, low, 4)
        for rows in rows_list:
            x = torch.randn(rows, k, generator=gen).bfloat16()
            kernel = best_us(partial(grid_matmul, x, packed, scales, 4, n, None), calls)
            torch_us = best_us(partial(F.linear, x, dense), calls)
            results.append(
                {"shape": [n, k], "rows": rows, "int8_grid_us": kernel, "torch_bf16_us": torch_us}
            )
    return results


def decode_attention(batch, context, calls) -> list[dict]:
    from engine.attention.cpu_backend import CPUAttentionBackend
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.torch_backend import TorchAttentionBackend
    from engine.kv.pool import PagedKVPool
    from engine.kv.sizing import KVLayout

    gen = torch.Generator().manual_seed(1)
    results = []
    for kv in ("bf16", "fp8_e4m3"):
        layout = KVLayout(num_layers=1, kind="gqa", num_kv_heads=3, head_dim=64)
        pages = batch * (-(-context // 16)) + 1
        pool = PagedKVPool(layout, pages, 16, kv)
        order = torch.randperm(pages * 16, generator=gen)
        contexts = [order[i * context : (i + 1) * context] for i in range(batch)]
        for slots in contexts:
            k = torch.randn(context, 3, 64, generator=gen).bfloat16()
            pool.write(0, k, k, slots)
        last = torch.stack([c[-1] for c in contexts])
        meta = AttentionMetadata.build(
            [1] * batch, [context] * batch, last, contexts, torch.device("cpu")
        )
        q = torch.randn(batch, 9, 64, generator=gen).bfloat16()
        cpu, ref = CPUAttentionBackend(), TorchAttentionBackend()
        results.append(
            {
                "kv_cache": kv,
                "batch": batch,
                "context": context,
                "c_us": best_us(partial(cpu._decode, 0, q, pool, meta, 0.125), calls),
                "torch_us": best_us(partial(ref._decode, 0, q, pool, meta, 0.125), calls),
            }
        )
    return results


def mla_decode_attention(dims, contexts, calls) -> list[dict]:
    """One MLA layer's attention for a decode step of one sequence (dims: Kimi's 16 heads
    a rank of TP 4, latent 512 + rope 64, nope 128, v 128), latent write included: the C
    kernel against torch's absorbed path, which it replaces on CPU."""
    from engine.attention.cpu_backend import CPUAttentionBackend
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.mla import MLADims, mla_attention
    from engine.kv.mla_pool import MLALatentPool, MLALayout

    gen = torch.Generator().manual_seed(4)
    h, nope, rope, v, r = dims
    layout = MLALayout(num_layers=1, kind="mla", latent_dim=r + rope, rope_dim=rope)
    results = []
    for kv in ("bf16", "fp8_e4m3"):
        for context in contexts:
            pages = -(-context // 16) + 1
            pool = MLALatentPool(layout, pages, 16, kv)
            # pages in a shuffled order, as the allocator hands them out after some churn
            order = torch.randperm(pages, generator=gen)[:, None] * 16 + torch.arange(16)
            slots = order.flatten()[:context]
            rows = torch.randn(context, r + rope, generator=gen).bfloat16()
            pool.write(0, rows[:, :r], rows[:, r:], slots)
            meta = AttentionMetadata.build([1], [context], slots[-1:], [slots], torch.device("cpu"))
            q = torch.randn(1, h, nope + rope, generator=gen).bfloat16()
            kv_b = (torch.randn(h * (nope + v), r, generator=gen) * r**-0.5).bfloat16()
            step = (q[..., :nope], q[..., nope:], rows[-1:, :r], rows[-1:, r:], kv_b, pool, meta)
            step = (*step, MLADims(h, nope, rope, v, r), (nope + rope) ** -0.5)
            cpu = CPUAttentionBackend()
            results.append(
                {
                    "kv_cache": kv,
                    "heads": h,
                    "context": context,
                    "c_us": best_us(partial(cpu.mla_decode, 0, *step), calls),
                    "torch_us": best_us(partial(mla_attention, 0, *step, "absorbed"), calls),
                }
            )
    return results


def prefill_attention(cases, rounds) -> list[dict]:
    """One layer's attention for a prefill step of `new` tokens over `prefix` cached ones
    (the default model's 9 query and 3 KV heads of 64), K/V write included."""
    from engine.attention.cpu_backend import CPUAttentionBackend
    from engine.attention.metadata import AttentionMetadata
    from engine.attention.torch_backend import TorchAttentionBackend
    from engine.kv.pool import PagedKVPool
    from engine.kv.sizing import KVLayout

    gen = torch.Generator().manual_seed(2)
    results = []
    for kv in ("bf16", "fp8_e4m3"):
        for prefix, new in cases:
            layout = KVLayout(num_layers=1, kind="gqa", num_kv_heads=3, head_dim=64)
            pool = PagedKVPool(layout, -(-(prefix + new) // 16), 16, kv)
            slots = torch.arange(prefix + new)
            if prefix:
                k = torch.randn(prefix, 3, 64, generator=gen).bfloat16()
                pool.write(0, k, k, slots[:prefix])
            meta = AttentionMetadata.build(
                [new], [prefix + new], slots[prefix:], [slots], torch.device("cpu")
            )
            q = torch.randn(new, 9, 64, generator=gen).bfloat16()
            k = torch.randn(new, 3, 64, generator=gen).bfloat16()
            step = (0, q, k, k, pool, meta, 0.125)
            cpu, ref = CPUAttentionBackend(), TorchAttentionBackend()
            results.append(
                {
                    "kv_cache": kv,
                    "prefix": prefix,
                    "new_tokens": new,
                    "c_us": best_us(partial(cpu.forward, *step), 1, rounds),
                    "torch_us": best_us(partial(ref.forward, *step), 1, rounds),
                }
            )
    return results


def argmax_rows(rows, vocab, calls) -> dict:
    from engine.cpu_kernels.argmax import row_argmax

    logits = torch.randn(rows, vocab)
    return {
        "rows": rows,
        "vocab": vocab,
        "c_us": best_us(lambda: row_argmax(logits), calls),
        "torch_us": best_us(lambda: logits.argmax(-1), calls),
    }


def moe_experts(hidden, experts, top_k, intermediate, tokens_list, calls) -> list[dict]:
    """One MoE layer's routed experts (4-bit grid weights): the C kernel that runs them
    all in one call against SparseMoE's per-expert loop it replaces."""
    from engine.cpu_kernels.grid_matmul import pack_codes
    from engine.layers.cpu_grid_weights import MAX_PACKED_ROWS, GridMethod, GridWeight
    from engine.layers.cpu_moe_experts import CpuMoeExperts
    from engine.layers.layer_ops import CPU_LAYER_OPS
    from engine.layers.moe import SparseMoE
    from engine.layers.moe_routing import RoutingConfig
    from engine.models.decoder import GatedMLP

    gen = torch.Generator().manual_seed(3)

    def grid(linear) -> None:
        n, k = linear.weight.shape
        codes = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
        step = torch.rand(n, k // 32, 1, generator=gen) * 0.01
        packed = GridWeight(*pack_codes(codes, step, -8 * step, 4), 4, n, "4-bit")
        linear.method = GridMethod(packed, MAX_PACKED_ROWS)
        linear.weight.data = linear.weight.data.new_empty((0, k))

    def expert(_: int) -> GatedMLP:
        mlp = GatedMLP(hidden, intermediate, reduce=False)
        grid(mlp.gate_up_proj)
        grid(mlp.down_proj)
        mlp.ops = CPU_LAYER_OPS
        return mlp

    moe = SparseMoE(hidden, RoutingConfig(num_experts=experts, top_k=top_k), expert)
    fused = CpuMoeExperts.build(moe)
    results = []
    for tokens in tokens_list:
        x = torch.randn(tokens, hidden, generator=gen).bfloat16()
        ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
        weights = torch.rand(tokens, top_k, generator=gen)
        results.append(
            {
                "shape": {
                    "hidden": hidden,
                    "experts": experts,
                    "top_k": top_k,
                    "moe_intermediate": intermediate,
                },
                "tokens": tokens,
                "experts_used": int(ids.unique().numel()),
                "fused_us": best_us(partial(fused.run, x, weights, ids), calls),
                "loop_us": best_us(partial(moe.run_experts, x, weights, ids), calls),
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a smoke test)")
    args = parser.parse_args()
    from engine.cpu_kernels.library import unavailable

    reason = unavailable()
    if reason:
        print(json.dumps({"benchmark": "cpu_kernels", "unavailable": reason}))
        return
    if args.quick:
        shapes, rows, calls, batch, context, vocab = [(64, 64)], [1, 3], 3, 2, 20, 1000
        prefills, rounds = [(0, 40), (30, 17)], 2
        mla = ((4, 16, 8, 16, 16), [20])
        moe = (64, 8, 2, 32, [1, 3])
    else:
        shapes = [(3072, 576), (576, 1536), (960, 576), (49152, 576)]
        rows, calls, batch, context, vocab = [1, 16], 50, 16, 100, 49152
        prefills, rounds = [(0, 2048), (6000, 2048)], 3
        mla = ((16, 128, 64, 128, 512), [512, 4096])  # Kimi K2, 64 heads at TP 4
        moe = (1280, 64, 8, 512, [1, 16])  # GLM-4.5 / Kimi K2 sized experts
    result = {
        "benchmark": "cpu_kernels",
        "machine": {"cpu": platform.machine(), "torch_threads": torch.get_num_threads()},
        "grid_products": grid_products(rows, shapes, calls),
        "decode_attention": decode_attention(batch, context, calls),
        "prefill_attention": prefill_attention(prefills, rounds),
        "mla_decode": mla_decode_attention(*mla, max(3, calls // 5)),
        "argmax": argmax_rows(16 if not args.quick else 2, vocab, calls),
        "moe_experts": moe_experts(*moe, calls),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
