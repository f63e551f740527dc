"""Linear layers that hold this rank's slice of a checkpoint matrix.

Fusing q/k/v (and gate/up) into one matrix turns three small matrix products
into one, which matters on CPU where per-op overhead is a large share of a
decode step. The checkpoint keeps them separate, so the fused layer knows
where each shard goes.

Tensor parallelism (docs/DISTRIBUTED.md) splits a layer one of two ways:
- column-parallel (`FusedLinear`): each rank holds some output rows of every
  shard (its heads of q, k and v; its part of gate and up), so the output is
  this rank's slice and needs no communication;
- row-parallel (`RowParallelLinear`): each rank holds some input columns and
  produces a partial sum; the block that owns the layer sums the partials over
  the ranks once (one all-reduce per attention block and per MLP block). The
  bias is added by rank 0 only, so the sum holds it once.
Both are `nn.Linear`s that forward through their linear method
(engine/layers/linear_methods.py), and the loaders take
the slices straight from the checkpoint (`narrow` on a lazily read tensor),
so a rank never holds a whole matrix it does not need.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.collectives import parallel
from engine.layers.linear_methods import MethodLinear
from engine.layers.packed_methods import is_packed_method
from engine.weights.lazy import materialize


@dataclass(frozen=True)
class RowSlice:
    """Which rows of the checkpoint tensor this rank holds: [start, start + size) of `full`."""

    full: int
    start: int
    size: int

    @staticmethod
    def whole(full: int) -> RowSlice:
        return RowSlice(full, 0, full)

    @staticmethod
    def even(full: int, what: str) -> RowSlice:
        """An even split over the tensor-parallel ranks."""
        size = parallel.split_size(full, what)
        return RowSlice(full, parallel.tp_rank() * size, size)

    @staticmethod
    def heads(num_heads: int, head_size: int, what: str, replicas: bool = False) -> RowSlice:
        """Whole heads for this rank. `replicas`: with fewer heads than ranks each head
        is replicated on tp/num_heads ranks (GQA key/value heads; never query heads,
        whose outputs the ranks sum)."""
        first, count = parallel.rank_heads(num_heads, what, replicas)
        return RowSlice(num_heads * head_size, first * head_size, count * head_size)


def _narrow(tensor, dim: int, piece: RowSlice, name: str) -> torch.Tensor:
    """The piece of a checkpoint tensor (a torch.Tensor or a lazily read one) along `dim`."""
    if tensor.shape[dim] != piece.full:
        raise ValueError(
            f"{name} has {tensor.shape[dim]} along dim {dim}, expected {piece.full} "
            f"(shape {tuple(tensor.shape)})"
        )
    if piece.start == 0 and piece.size == piece.full and isinstance(tensor, torch.Tensor):
        return tensor
    return tensor.narrow(dim, piece.start, piece.size)


def _load_into(target: torch.Tensor, rows: slice, tensor: torch.Tensor, name: str) -> None:
    expected = (rows.stop - rows.start, *target.shape[1:])
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected {expected}")
    with torch.no_grad():
        target[rows].copy_(materialize(tensor))


class FusedLinear(MethodLinear):
    """A Linear whose output rows are the concatenation of named shards, each
    holding this rank's rows of its checkpoint tensor (all of them at TP 1)."""

    def __init__(
        self,
        in_features: int,
        shard_sizes: dict[str, int | RowSlice],
        bias: bool = False,
    ):
        pieces = {
            name: size if isinstance(size, RowSlice) else RowSlice.whole(size)
            for name, size in shard_sizes.items()
        }
        super().__init__(in_features, sum(p.size for p in pieces.values()), bias=bias)
        self.shard_pieces = pieces
        self.shard_offsets: dict[str, tuple[int, int]] = {}
        offset = 0
        for name, piece in pieces.items():
            self.shard_offsets[name] = (offset, piece.size)
            offset += piece.size

    def load_shard(self, shard: str, kind: str, tensor) -> None:
        """Copy this rank's rows of one checkpoint tensor ('weight' or 'bias') into its rows."""
        offset, size = self.shard_offsets[shard]
        target = self.weight if kind == "weight" else self.bias
        if target is None:
            raise KeyError(f"{shard}.{kind}: this layer has no {kind}")
        if tuple(tensor.shape[1:]) != tuple(target.shape[1:]):
            raise ValueError(
                f"{shard}.{kind} has shape {tuple(tensor.shape)}, expected "
                f"({self.shard_pieces[shard].full}, {', '.join(map(str, target.shape[1:]))})".replace(
                    ", )", ")"
                )
            )
        piece = _narrow(tensor, 0, self.shard_pieces[shard], f"{shard}.{kind}")
        if is_packed_method(self.method) and kind == "weight":
            self.method.load_rows(self, offset, piece)
            return
        _load_into(target, slice(offset, offset + size), piece, f"{shard}.{kind}")

    def load_concatenated(self, kind: str, tensor) -> None:
        """A checkpoint tensor that already holds every shard, whole, in order
        (GLM-4's `gate_up_proj`): each shard takes its rows from its part."""
        start = 0
        for shard, piece in self.shard_pieces.items():
            part = tensor.narrow(0, start, piece.full)
            self.load_shard(shard, kind, part)
            start += piece.full
        if start != tensor.shape[0]:
            raise ValueError(
                f"{kind} has {tensor.shape[0]} rows, the shards {list(self.shard_pieces)} "
                f"add up to {start}"
            )


class ColumnParallelLinear(FusedLinear):
    """One matrix split by output rows, loaded from the checkpoint tensor of its own name."""

    def __init__(self, in_features: int, out_features: int | RowSlice, bias: bool = False):
        super().__init__(in_features, {"": out_features}, bias)

    def load_checkpoint(self, kind: str, tensor) -> None:
        self.load_shard("", kind, tensor)


class RowParallelLinear(MethodLinear):
    """This rank's input columns of a matrix; the output is a partial sum that the
    owning block all-reduces. The bias lives on rank 0 (zeros elsewhere)."""

    def __init__(self, in_features: int | RowSlice, out_features: int, bias: bool = False):
        piece = in_features if isinstance(in_features, RowSlice) else RowSlice.whole(in_features)
        super().__init__(piece.size, out_features, bias=bias)
        self.in_piece = piece
        # Decided when built: a layer built whole (an expert-parallel rank's expert) keeps it.
        self.holds_bias = piece.size == piece.full or parallel.tp_rank() == 0

    def load_checkpoint(self, kind: str, tensor) -> None:
        if kind == "bias":
            _load_into(self.bias, slice(0, self.out_features), tensor, "bias")
            if not self.holds_bias:
                with torch.no_grad():
                    self.bias.zero_()
            return
        if tensor.shape[0] != self.out_features:
            raise ValueError(
                f"weight has shape {tuple(tensor.shape)}, expected "
                f"({self.out_features}, {self.in_piece.full})"
            )
        piece = _narrow(tensor, 1, self.in_piece, "weight")
        if is_packed_method(self.method):
            self.method.load_rows(self, 0, piece)
            return
        _load_into(self.weight, slice(0, self.out_features), piece, "weight")
