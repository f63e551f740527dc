"""Which instructions multiply grid weights (engine/layers/cpu_grid_weights.py) at many rows.

The int8 kernel (AVX-512 VNNI or AVX2 dot products, engine/cpu_kernels/grid_matmul.c)
serves every row count, and on processors without matrix units it is the
fastest at every one. Prefill and large batches are matrix work, though, and
an Intel Xeon with AMX multiplies BF16 tiles through oneDNN at several times
the VNNI rate (about 740 GFLOP/s against the engine's 185 on 2 cores, issue 25).
There, from `BF16_MIN_ROWS` rows of activations on, a grid weight is expanded
to BF16 (exactly: the float32 value the checkpoint's dequantizer computes, in
every grid format, rounded to nearest even, C, about a millisecond for a
3072x576 weight) and multiplied by torch, which
oneDNN runs on the tiles. Decode steps with fewer rows stay on VNNI: they are
bound by memory, and the expanded weight is four times the bytes.

Deterministic mode never reaches this (it gives no layer a grid method), so a
path that depends on the row count cannot break its batch invariance.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from engine.cpu_kernels.grid_matmul import grid_dequantize, grid_matmul
from engine.host.cpu_features import cpu_features

INT8, BF16 = "int8", "bf16"
PATHS = (INT8, BF16)
BF16_MIN_ROWS = 64

_chosen: tuple[str, int] | None = None  # set by `use_matrix_path` (benchmarks, tests)


def matrix_path() -> tuple[str, int]:
    """(path, the row count from which it applies): BF16 where the CPU has AMX."""
    if _chosen is not None:
        return _chosen
    return (BF16, BF16_MIN_ROWS) if cpu_features().amx else (INT8, 0)


@contextlib.contextmanager
def use_matrix_path(path: str, min_rows: int = BF16_MIN_ROWS) -> Iterator[None]:
    """Multiply grid weights on `path` from `min_rows` rows on, inside the block (to
    measure both paths in one run, or check one on a processor that would not pick it)."""
    global _chosen
    if path not in PATHS:
        raise ValueError(f"unknown CPU matrix path {path!r}; choose from {', '.join(PATHS)}")
    before, _chosen = _chosen, (path, min_rows)
    try:
        yield
    finally:
        _chosen = before


def describe_matrix_path() -> dict:
    path, min_rows = matrix_path()
    if path == INT8:
        from engine.cpu_kernels.library import isa

        built = {"avx512": "AVX-512 VNNI", "avx2": "AVX2"}.get(isa() or "", "no C kernels")
        return {"cpu_prefill_path": f"int8 dot products ({built}) at every row count"}
    return {"cpu_prefill_path": f"bf16 tiles through oneDNN from {min_rows} rows, int8 below"}


def grid_product(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    fmt: int,
    rows: int,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [M, K] times a grid weight [rows, K]^T in format `fmt` (a GridFormat) on the path
    this many rows take."""
    path, min_rows = matrix_path()
    if path == INT8 or x.shape[0] < min_rows:
        return grid_matmul(x, codes, scales, fmt, rows, bias, out_dtype)
    dense = grid_dequantize(codes, scales, fmt, rows, x.shape[1])
    out = F.linear(x.to(torch.bfloat16), dense)  # float32 accumulation, BF16 out
    out_dtype = out_dtype or x.dtype
    if bias is not None:
        return (out.float() + bias).to(out_dtype)
    return out.to(out_dtype)
