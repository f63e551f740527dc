"""llama.cpp's K-quant weights in the int8 grid kernel's layouts (grid_formats.h).

A K-quant row is super-blocks of 256 values, each with a half-precision d (and
dmin) and small integer factors per 32 (Q4_K, Q5_K: sc and mn, 6-bit) or per 16
values (Q6_K: sc, int8). The kernel multiplies the factors out in float32, where
the products are exact, so the packed weight holds what the file holds: the
codes at their width (4 bits as nibbles, a fifth or fifth and sixth bit as planes
after them) and the factors as they are, arranged by tile of 16 rows.
"""

from __future__ import annotations

import torch

from engine.cpu_kernels.grid_matmul import (
    SUPER_BLOCK,
    TILE,
    GridFormat,
    code_vectors,
    nibble_vectors,
    pad_rows,
)


def _planes(vectors: torch.Tensor, fmt: GridFormat) -> list[torch.Tensor]:
    """The codes' bits above the nibble, per group (grid_formats.h): Q5_K's fifth bit of
    vector j as bit j of one plane; Q6_K's two as bits 2 (j % 4) of plane j / 4."""
    if fmt == GridFormat.Q4_K:
        return []
    width = fmt.bits - 4
    high = (vectors >> 4) & ((1 << width) - 1)  # [tiles, groups, 8, 64]
    per_plane = 8 // width
    planes = [
        sum(high[:, :, p * per_plane + i] << (width * i) for i in range(per_plane))
        for p in range(8 // per_plane)
    ]
    return [torch.stack(planes, 2).reshape(*vectors.shape[:2], -1)]


def _by_tile(values: torch.Tensor) -> torch.Tensor:
    """[N, S, ...] (N whole tiles) -> [tiles, S, ..., 16]: a tile's 16 rows side by side."""
    tiles = values.reshape(values.shape[0] // TILE, TILE, *values.shape[1:])
    return tiles.movedim(1, -1).contiguous()


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """float16 [N, S] -> the 16 rows' halves of each tile and super-block [tiles, S, 32]."""
    return _by_tile(values.to(torch.float16)).view(torch.uint8)


def pack_kquant(
    fmt: GridFormat,
    codes: torch.Tensor,
    d: torch.Tensor,
    scales: torch.Tensor,
    dmin: torch.Tensor | None = None,
    mins: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) as flat uint8 tensors in `fmt`'s layout, rows padded to whole tiles.

    codes [N, K/32, 32] uint8 below 2**fmt.bits (Q6_K: u of d sc (u - 32)); d [N, K/256] half;
    scales [N, K/256, 8] uint8 (Q4_K, Q5_K: sc per 32 values) or [N, K/256, 16] int8
    (Q6_K: per 16); dmin [N, K/256] float16 and mins [N, K/256, 8] uint8 (Q4_K, Q5_K).
    """
    if codes.shape[1] % (SUPER_BLOCK // 32):
        raise ValueError(f"{fmt.name} rows must be whole super-blocks of {SUPER_BLOCK} values")
    codes, d, scales = (pad_rows(t) for t in (codes, d, scales))
    vectors = code_vectors(codes)
    tiles, groups = vectors.shape[:2]
    packed_codes = torch.cat(
        [nibble_vectors(vectors).reshape(tiles, groups, -1)] + _planes(vectors, fmt), -1
    )
    blocks = [_half_bytes(d)]
    if fmt == GridFormat.Q6_K:
        # sub-blocks 2j and 2j + 1 of 16 values make group j: 32 bytes a group
        blocks.append(_by_tile(scales.view(torch.uint8)).reshape(tiles, d.shape[1], -1))
    else:
        dmin, mins = pad_rows(dmin), pad_rows(mins)
        blocks.append(_half_bytes(dmin))
        factors = torch.stack((_by_tile(scales), _by_tile(mins)), 3)  # [tiles, S, 8, 2, 16]
        blocks.append(factors.reshape(tiles, d.shape[1], -1))
    return packed_codes.reshape(-1), torch.cat(blocks, -1).reshape(-1)
