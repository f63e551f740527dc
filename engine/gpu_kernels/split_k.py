"""Split-K for decode-sized GEMMs (W4A16, FP8-block): how many slices of K, and the sum.

At M <= 16 a product is a read of the weights, and one program per BLOCK_N
output columns leaves an H200 short of programs where N is small against K
(N = 7168 at K = 18432: 112 programs for 132 SMs, one each, nothing to hide
memory latency behind). Cutting K into slices brings it to about two
programs per SM. Each slice writes a float32 partial product to
`[splits, M, N]`, and the host sums them in slice order, so the result is the
same on every run (no atomics). Larger M has enough output tiles and is not
split.
"""

from __future__ import annotations

import torch
import triton

MIN_TILES_PER_SPLIT = 4  # K tiles each slice keeps: fewer, and the partial sums cost more
MAX_SPLIT_ROWS = 16  # M above this has enough output tiles


def k_splits(m: int, n: int, k: int, cfg: dict, sms: int) -> int:
    """Slices of K for an [m, k] x [k, n] product in tiles cfg["BLOCK_M" / "BLOCK_N" / "BLOCK_K"]."""
    if m > MAX_SPLIT_ROWS:
        return 1
    tiles = triton.cdiv(m, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"])
    wanted = triton.cdiv(2 * sms, tiles)
    most = max(1, triton.cdiv(k, cfg["BLOCK_K"]) // MIN_TILES_PER_SPLIT)
    return max(1, min(wanted, most))


def split_target(splits: int, out: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(what the kernel writes, its row stride, its slice stride): `out` itself for one
    slice, else a float32 [splits, M, N] buffer of partial products."""
    if splits < 1:
        raise ValueError(f"splits must be at least 1, got {splits}")
    if splits == 1:
        return out, out.stride(0), 0
    m, n = out.shape
    partials = torch.empty(splits, m, n, dtype=torch.float32, device=out.device)
    return partials, partials.stride(1), partials.stride(0)


def k_per_split(k: int, block_k: int, splits: int) -> int:
    """Whole K tiles per slice; a count past the tiles leaves empty slices (zeros)."""
    return triton.cdiv(triton.cdiv(k, block_k), splits) * block_k


def finish(target: torch.Tensor, out: torch.Tensor) -> None:
    """Sum the partial products into `out`, in slice order (nothing to do for one slice)."""
    if target is not out:
        out.copy_(target.sum(0))
