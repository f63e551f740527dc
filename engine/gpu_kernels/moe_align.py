"""Sort a MoE step's (token, slot) pairs by expert into padded blocks, for one grouped GEMM.

Pair p = token * top_k + slot is routed to expert `topk_ids[token, slot]`.
The grouped GEMM runs one program row per block of BLOCK_M pairs of a single
expert, so each expert's pairs are laid out contiguously, padded up to a
multiple of BLOCK_M with the sentinel `num_pairs` (rows the kernels mask):

    sorted_ids   int32 [capacity]: pair indices, expert by expert
    block_expert int32 [capacity // BLOCK_M]: each block's expert, -1 past the end

Everything stays on the device and no size is read back to the host (a
synchronisation per MoE layer would stall decode): `capacity` is the bound
`pairs + min(E, pairs) * (BLOCK_M - 1)` (each expert that receives pairs
adds at most BLOCK_M - 1 padding), rounded up to whole blocks, and blocks
past the experts' total get expert -1 and return at once. An expert with no
pairs gets no block. Within an expert pairs keep their order (a stable
sort), so the result does not depend on the sort's implementation. The
per-expert counts are binary searches in the sorted keys, not torch.bincount
(which on CUDA reads its output size back); tests/engine/gpu_kernels/
test_moe_sync_free.py runs the step under engine.devtools.testing.capture_hazards.

Ids outside [0, E) (negative ids: an expert another expert-parallel rank
holds) get no block: their pairs contribute nothing. Checking ids against E
would need a host synchronisation, so larger ids are dropped the same way
rather than read out of bounds.

This is a handful of torch operators (vLLM and SGLang use a CUDA kernel for
the same step); at decode sizes their launch cost, not their work, is what
the GPU check would show.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MoeBlocks:
    sorted_ids: torch.Tensor  # int32 [capacity]
    block_expert: torch.Tensor  # int32 [capacity // block_m]
    block_m: int
    num_pairs: int  # T * top_k: the padding sentinel
    top_k: int


def moe_capacity(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Slots enough for any routing of num_pairs pairs over num_experts experts, in whole blocks."""
    bound = num_pairs + min(num_experts, num_pairs) * (block_m - 1)
    return -(-bound // block_m) * block_m


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoeBlocks:
    """Pairs of topk_ids [T, top_k] sorted by expert into blocks of block_m (see the module doc)."""
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [tokens, top_k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"topk_ids has dtype {topk_ids.dtype}, expected int32 or int64")
    if num_experts <= 0 or block_m <= 0:
        raise ValueError(f"num_experts ({num_experts}) and block_m ({block_m}) must be positive")
    device = topk_ids.device
    pairs = topk_ids.numel()
    flat = topk_ids.reshape(-1).long()
    # Expert E stands for "not here": it sorts last and gets no block.
    keyed = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    experts_sorted, order = torch.sort(keyed, stable=True)
    # Each expert's run in the sorted keys, found by binary search: the counts without
    # torch.bincount, which on CUDA reads its output size back to the host.
    expert_range = torch.arange(num_experts + 1, device=device)
    firsts = torch.searchsorted(experts_sorted, expert_range)  # where each run begins
    counts = torch.searchsorted(experts_sorted, expert_range, right=True) - firsts
    padded = (counts + block_m - 1) // block_m * block_m
    padded[num_experts] = 0
    ends = padded.cumsum(0)
    starts = ends - padded

    ranks = torch.arange(pairs, device=device) - firsts[experts_sorted]
    capacity = moe_capacity(pairs, num_experts, block_m)
    # Dropped pairs are written to one spare slot past the end, then cut off
    # (a boolean mask would need the host to learn its size).
    dest = torch.where(experts_sorted < num_experts, starts[experts_sorted] + ranks, capacity)
    sorted_ids = torch.full((capacity + 1,), pairs, dtype=torch.int32, device=device)
    sorted_ids[dest] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block_m, device=device)
    # The expert whose padded run contains the block's first slot; empty experts have
    # starts == ends and are skipped; blocks past the last run get E -> -1.
    block_expert = torch.searchsorted(ends[:num_experts], block_starts, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return MoeBlocks(sorted_ids[:capacity], block_expert, block_m, pairs, topk_ids.shape[1])
