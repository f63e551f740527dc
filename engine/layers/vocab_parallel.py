"""Embedding and LM head split over the vocabulary.

Each rank holds a contiguous range of vocabulary rows; the vocabulary is
padded to a multiple of the rank count, and the padding rows are zeros that
the gathered logits drop. The embedding looks up the ids in its range (zeros
for the rest) and sums over the ranks; the head computes its logits columns
and gathers them, so every rank ends with the full [tokens, vocab] logits
(rank 0 samples from them). At TP 1 both are an ordinary embedding and head.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.collectives import parallel
from engine.cpu_kernels.grid_matmul import grid_gather_rows
from engine.layers.linear_methods import MethodLinear


def vocab_range(vocab_size: int) -> tuple[int, int, int]:
    """(first row, rows held, rows of the checkpoint in range) for this rank."""
    tp, rank = parallel.tp_size(), parallel.tp_rank()
    per_rank = -(-vocab_size // tp)
    start = rank * per_rank
    return start, per_rank, max(0, min(vocab_size, start + per_rank) - start)


def _load_rows(weight: nn.Parameter, tensor, vocab_size: int, start: int, present: int) -> None:
    if tuple(tensor.shape) != (vocab_size, weight.shape[1]):
        raise ValueError(
            f"weight has shape {tuple(tensor.shape)}, expected ({vocab_size}, {weight.shape[1]})"
        )
    with torch.no_grad():
        weight.zero_()
        if present:
            weight[:present].copy_(tensor.narrow(0, start, present))


class VocabParallelEmbedding(nn.Module):
    # The table kept in its GGUF file's blocks (a CPU grid weight, one rank), looked up a
    # few rows a step: half to a quarter of a BF16 table's bytes, and no float copy at load.
    grid = None

    def __init__(self, vocab_size: int, hidden_size: int):
        super().__init__()
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.start, rows, self.present = vocab_range(vocab_size)
        self.weight = nn.Parameter(torch.empty(rows, hidden_size))

    def load_checkpoint(self, kind: str, tensor) -> None:
        _load_rows(self.weight, tensor, self.vocab_size, self.start, self.present)

    def use_grid(self, packed) -> None:
        """Look rows up in `packed` (engine/layers/cpu_grid_weights.py's GridWeight of the
        whole table) instead of a dense weight, which is dropped."""
        if parallel.tp_size() != 1 or packed.rows != self.vocab_size:
            raise ValueError("a grid embedding holds the whole table on one rank")
        self.grid = packed
        self.weight = nn.Parameter(
            torch.empty((0, self.hidden_size), dtype=self.weight.dtype), requires_grad=False
        )

    def packed_bytes(self) -> int:
        return 0 if self.grid is None else self.grid.nbytes

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.grid is not None:
            grid = self.grid
            return grid_gather_rows(
                grid.codes,
                grid.scales,
                grid.format,
                grid.rows,
                self.hidden_size,
                input_ids,
                self.weight.dtype,
            )
        if parallel.tp_size() == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.present)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return parallel.all_reduce(out)


class ParallelLMHead(MethodLinear):
    """The output projection over this rank's vocabulary rows."""

    def __init__(self, hidden_size: int, vocab_size: int):
        self.vocab_size = vocab_size
        start, rows, present = vocab_range(vocab_size)
        super().__init__(hidden_size, rows, bias=False)
        self.start, self.present = start, present

    def load_checkpoint(self, kind: str, tensor) -> None:
        _load_rows(self.weight, tensor, self.vocab_size, self.start, self.present)

    def gather(self, local_logits: torch.Tensor) -> torch.Tensor:
        """Every rank's columns, in vocabulary order, without the padding."""
        if parallel.tp_size() == 1:
            return local_logits
        return parallel.all_gather_last_dim(local_logits)[..., : self.vocab_size]
