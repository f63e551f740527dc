"""What one decode step reads from memory, and how fast this machine can read.

Single-stream decode is memory-bound: each step multiplies one token's
activations by every weight the token touches, and those weights stream from
memory once per step. So a step reads one row of the embedding table; every
attention, norm, router, dense-MLP and shared-expert weight; top_k/n_routed
of the routed experts (on average: which experts a token picks varies, their
sizes do not); and the head. Each at the size the engine holds it, which is
why it is counted from what each engine holds (the GGUF file's tensors for
llama.cpp, which reads them in place; the packed or dense tensors of
Resident's loaded model) and not from the checkpoint. The KV cache a step
reads is left out: at 640 tokens of context it is a few percent of the weights.

Against that: this machine's copy bandwidth, a large torch copy on the
engines' thread count, best of a few, counted as STREAM counts a copy (bytes
read plus bytes written). `bytes per token x tokens/s` over it says how close
an engine comes to the memory's speed. Where the weights a token reads fit in
the last-level cache (a model cut to a few layers; some server CPUs' L3 holds
hundreds of MiB), steps read them from the cache and the share can pass 1.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|token_embd)\.")
# Routed experts: `mlp.experts.N.` (transformers' files, Resident's modules), a stacked
# `mlp.experts.` tensor, or a GGUF `ffn_*_exps`; never `shared_experts` or `ffn_*_shexp`.
_ROUTED = re.compile(r"\.experts\.|_exps\.")


@dataclass(frozen=True)
class Held:
    """One tensor an engine holds: its name, its bytes, and its rows (an embedding
    table's vocabulary, of which a token reads one)."""

    name: str
    nbytes: int
    rows: int = 1


def decode_bytes(held: Iterable[Held], top_k: int = 0, n_routed: int = 0) -> int:
    """Bytes of weights one decode step of one sequence reads (module docstring)."""
    total = 0.0
    for tensor in held:
        if _EMBEDDING.search(tensor.name):
            total += tensor.nbytes / tensor.rows
        elif n_routed and _ROUTED.search(tensor.name):
            total += tensor.nbytes * top_k / n_routed
        else:
            total += tensor.nbytes
    return round(total)


def gguf_decode_bytes(path: Path) -> int:
    """`decode_bytes` of a GGUF file's tensors, as llama.cpp holds them (mapped in place)."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))

    def field(key: str, default=0):
        found = reader.fields.get(key)
        return found.contents() if found is not None else default

    arch = field("general.architecture", "")
    held = [
        # GGUF lists dimensions innermost first: [hidden, vocab] for the embedding table.
        Held(t.name, int(t.n_bytes), int(t.shape[-1]) if len(t.shape) > 1 else 1)
        for t in reader.tensors
    ]
    return decode_bytes(
        held, int(field(f"{arch}.expert_used_count")), int(field(f"{arch}.expert_count"))
    )


def engine_held(model) -> list[Held]:
    """The tensors Resident's loaded `model` holds for decoding, each once. A linear layer
    whose method keeps a packed form beside it (CPU grid weights) counts that form, not
    a dense weight kept for many-row products: a decode step reads the packed one. So
    for MLA attention with latent grids: its dense kv_b_proj serves prefill only."""
    from engine.layers.linear_methods import MethodLinear

    seen: set[int] = set()
    held = []
    prefill_only = {
        f"{name}.kv_b_proj"
        for name, module in model.named_modules()
        if getattr(module, "latent_grid", None) is not None
    }
    for name, module in model.named_modules():
        if name in prefill_only:
            continue
        beside = module.method.bytes_beside(module) if isinstance(module, MethodLinear) else 0
        for param_name, param in module.named_parameters(recurse=False):
            skipped = beside and param_name == "weight"
            if param.numel() == 0 or param.data_ptr() in seen or skipped:
                continue
            seen.add(param.data_ptr())
            rows = param.shape[0] if param.dim() == 2 else 1
            held.append(Held(f"{name}.{param_name}", param.numel() * param.element_size(), rows))
        if beside:
            held.append(Held(f"{name}.packed", beside))
        packed = module.packed_bytes() if hasattr(module, "packed_bytes") else 0
        if packed:  # weights a module keeps outside parameters: a grid embedding, MLA's
            # latent grids; an embedding table is read a row a token
            rows = getattr(module, "vocab_size", 1)
            held.append(Held(f"{name}.weight" if rows > 1 else f"{name}.grids", packed, rows))
    return held


def last_level_cache_bytes(cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The size of the CPU's last cache level (Linux's sysfs), or None where it is not said.
    Weights that fit in it are not read from memory at every step."""
    sizes = {}
    for index in cpu.glob("index*"):
        try:
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        sizes[level] = int(size.rstrip("KMG")) * scale
    return sizes[max(sizes)] if sizes else None


def copy_bandwidth(threads: int, repeats: int = 5) -> float:
    """Bytes read plus written per second by a torch copy on `threads` threads, each buffer
    twice the last-level cache (at least 512 MiB), so the copy runs from memory."""
    import torch

    source = torch.ones(_beyond_cache_bytes() // 4)
    target = torch.empty_like(source)  # first touched by the untimed copy
    return 2 * source.nbytes / _best_seconds(lambda: target.copy_(source), threads, repeats)


def read_bandwidth(threads: int, repeats: int = 5) -> float:
    """Bytes read per second by a torch sum on `threads` threads over a buffer twice the
    last-level cache (at least 512 MiB): the ceiling of one-stream decode, which reads its
    weights and writes almost nothing (the copy bandwidth counts a write per byte read, so
    a decode can pass it). The buffer is in huge pages where the kernel gives them, as the
    packed weights are once collapsed (4 KiB pages read 4-12% slower on 2 Zen 4 cores), and
    holds random values: a hypervisor may merge pages of equal bytes (a sum of ones ran at
    52 GB/s where random values ran at 34 there), and merged pages are read from cache."""
    import torch

    from engine.host.madvise import HUGE_PAGE, MADV_COLLAPSE, MADV_HUGEPAGE, advise

    nbytes = -(-_beyond_cache_bytes() // HUGE_PAGE) * HUGE_PAGE
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # not yet touched: no pages
    offset = -raw.data_ptr() % HUGE_PAGE
    advise(raw.data_ptr() + offset, nbytes, MADV_HUGEPAGE)  # before the first write
    values = raw[offset : offset + nbytes].view(torch.float32)
    values.uniform_()
    advise(values.data_ptr(), nbytes, MADV_COLLAPSE)  # where huge pages came too late
    return nbytes / _best_seconds(values.sum, threads, repeats)


def _best_seconds(step, threads: int, repeats: int) -> float:
    """The fastest of `repeats` timed calls of `step` on `threads` torch threads, after one
    untimed call (first touches and page faults are not bandwidth)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        step()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        torch.set_num_threads(previous)


def _beyond_cache_bytes() -> int:
    """A buffer size that streams from memory: twice the last-level cache, at least 512 MiB."""
    return max(2**29, 2 * (last_level_cache_bytes() or 0))
