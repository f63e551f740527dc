"""Attention whose result for a query depends only on that query and its context.

The padded batched path (torch_backend) lets batch size, padding and chunking
change the shapes of the reductions, and so their rounding. Here each
sequence is computed on its own, in float32, with fixed shapes throughout:
queries in tiles of QUERY_TILE rows, keys in blocks of KEY_BLOCK positions
aligned to absolute positions. Scores of every block are computed first; the
row maximum is exact in any order; then exp-weights and values are
accumulated block by block in position order. A block entirely after a query
contributes exact zeros, so a query's result is the same whether its context
was prefilled at once, in chunks, found in the prefix cache, or decoded.
"""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata

QUERY_TILE = 16
KEY_BLOCK = 64


def _sequence_attention(
    q: torch.Tensor,  # [n, H, D] float32, queries of one sequence
    q_pos: torch.Tensor,  # [n] absolute positions
    keys: torch.Tensor,  # [L, H, D] float32 (KV heads already expanded)
    values: torch.Tensor,  # [L, H, Dv]
    scale: float,
) -> torch.Tensor:
    n, heads, _ = q.shape
    length = keys.shape[0]
    blocks = -(-length // KEY_BLOCK)
    pad = blocks * KEY_BLOCK - length
    if pad:
        keys = torch.cat([keys, keys.new_zeros(pad, *keys.shape[1:])])
        values = torch.cat([values, values.new_zeros(pad, *values.shape[1:])])
    k_blocks = keys.permute(1, 2, 0)  # [H, D, Lp]
    v_blocks = values.transpose(0, 1)  # [H, Lp, Dv]
    key_pos = torch.arange(blocks * KEY_BLOCK)
    outputs = []
    for start in range(0, n, QUERY_TILE):
        tile = q[start : start + QUERY_TILE]
        tile_pos = q_pos[start : start + QUERY_TILE]
        rows = tile.shape[0]
        if rows < QUERY_TILE:
            tile = torch.cat([tile, tile.new_zeros(QUERY_TILE - rows, heads, tile.shape[2])])
            tile_pos = torch.cat([tile_pos, tile_pos.new_zeros(QUERY_TILE - rows)])
        tile = tile.transpose(0, 1)  # [H, T, D]
        scores = []
        for b in range(blocks):
            block = slice(b * KEY_BLOCK, (b + 1) * KEY_BLOCK)
            s = torch.bmm(tile, k_blocks[:, :, block]) * scale  # [H, T, KEY_BLOCK]
            visible = key_pos[block][None, :] <= tile_pos[:, None]  # [T, KEY_BLOCK]
            scores.append(s.masked_fill(~visible, float("-inf")))
        row_max = torch.stack([s.amax(-1) for s in scores]).amax(0)  # [H, T]
        total = torch.zeros_like(row_max)
        acc = tile.new_zeros(heads, QUERY_TILE, v_blocks.shape[-1])
        for b, s in enumerate(scores):
            p = torch.exp(s - row_max[..., None])
            total = total + p.sum(-1)
            acc = acc + torch.bmm(p, v_blocks[:, b * KEY_BLOCK : (b + 1) * KEY_BLOCK])
        out = acc / total[..., None]
        outputs.append(out.transpose(0, 1)[:rows])
    return torch.cat(outputs)


class DeterministicAttentionBackend:
    name = "deterministic"

    def forward(self, layer, q, k, v, pool, meta: AttentionMetadata, softmax_scale: float):
        pool.write(layer, k, v, meta.slot_mapping)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device)
        group = q.shape[1] // k.shape[1]
        for b in range(meta.context_slots.shape[0]):
            length = int(meta.context_lens[b])
            n = int(meta.query_lens[b])
            rows = meta.query_index[b, :n]
            keys, values, k_factor, v_factor = pool.gather(
                layer, meta.context_slots[b, :length], torch.float32
            )
            keys = keys.repeat_interleave(group, dim=1)
            values = values.repeat_interleave(group, dim=1)
            positions = torch.arange(length - n, length)
            queries = q[rows].float()
            if isinstance(k_factor, torch.Tensor):  # per-KV-head scales: onto the queries
                queries = queries * k_factor.repeat_interleave(group).view(-1, 1)
                k_factor = 1.0
            if isinstance(v_factor, torch.Tensor):
                v_factor = v_factor.repeat_interleave(group).view(-1, 1)
            result = _sequence_attention(queries, positions, keys, values, softmax_scale * k_factor)
            out[rows] = (result * v_factor).to(q.dtype)
        return out
