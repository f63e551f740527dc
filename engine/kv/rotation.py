"""Hadamard rotation of K and V before FP8 quantization (DESIGN.md §3, `--kv-rotation`).

A few channels of K (and some of V) carry most of the magnitude; a per-tensor
FP8 scale set by them leaves the other channels with few significant bits.
An orthonormal Hadamard rotation spreads every channel over all the others,
so the amax shrinks towards the RMS and the quantization error is shared out.
Attention is unchanged in exact arithmetic: q·k = (qH)·(kH) and
softmax(...)(vH)Hᵀ = softmax(...)v for an orthonormal H.

The matrix: the normalised Sylvester Hadamard matrix H_n (entries ±1/√n,
symmetric, H_n H_n = I) when the head dim n is a power of two. Otherwise a
block-diagonal matrix of Sylvester blocks of size b, the largest power of
two dividing n (96 = 3 blocks of 32, 80 = 5 of 16, 576 = 9 of 64); it is still
orthonormal and symmetric but only mixes channels within a block. An odd
dim would get blocks of 1, i.e. no rotation; no served model has one.

Vectors are rows: `rotate(x) = x @ H` over the last dim, in float32, cast
back to x's dtype: one matrix product, or, with `batch_invariant`
(deterministic mode), the fast Walsh-Hadamard butterflies, whose additions
are the same for a row however many rows run together. Because H is
symmetric and orthonormal, rotating twice is the identity.

Where it is applied: GQA models rotate q, k and v after RoPE and the
attention output back, at run time (engine.models.decoder.RotatedKVAttention),
leaving the weights as loaded. MLA rotates the latent and the rope key at run
time too, and folds the latent's inverse into kv_b_proj, the one matrix that
reads the cache and stays dense anyway (attention reads it), with the helper
below (in float32, cast back once): a linear layer's input columns that
consume rotated values become W' = W H.
"""

from __future__ import annotations

import functools

import torch

ROTATIONS = ("none", "hadamard")


def hadamard_block_size(dim: int) -> int:
    """The largest power of two dividing `dim`: the Sylvester block the rotation uses."""
    if dim < 1:
        raise ValueError(f"rotation dim must be positive, not {dim}")
    return dim & -dim


@functools.lru_cache(maxsize=16)
def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n**0.5).float()


def hadamard_matrix(n: int) -> torch.Tensor:
    """The normalised Sylvester Hadamard matrix of order n (a power of two), float32."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"a Sylvester Hadamard matrix needs a power of two, not {n}")
    return _sylvester(n).clone()


class HadamardRotation:
    """The (block-diagonal) orthonormal Hadamard rotation of vectors of size `dim`."""

    kind = "hadamard"
    # The layer ops that compute `rotate` (engine/layers/layer_ops.py: the C kernel's
    # once the engine chooses them); None: the float32 torch product here.
    ops = None

    def __init__(self, dim: int, batch_invariant: bool = False):
        self.dim = dim
        self.batch_invariant = batch_invariant
        self.block = hadamard_block_size(dim)
        self._blocks = hadamard_matrix(self.block)
        self._on: dict[torch.device, torch.Tensor] = {}

    def describe(self) -> str:
        if self.block == self.dim:
            return f"Hadamard {self.dim}x{self.dim}"
        return f"block-diagonal Hadamard, {self.dim // self.block} blocks of {self.block}"

    def matrix(self) -> torch.Tensor:
        """The full [dim, dim] float32 matrix (block-diagonal when dim is not a power of two)."""
        return torch.block_diag(*[self._blocks] * (self.dim // self.block))

    def block_on(self, device: torch.device) -> torch.Tensor:
        """The [block, block] float32 Sylvester matrix on `device` (copied there once)."""
        block = self._on.get(device)
        if block is None:
            block = self._on[device] = self._blocks.to(device)
        return block

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """x @ H over the last dim, computed in float32, returned in x's dtype (a new tensor).

        The product is the layer ops' (engine/layers/layer_ops.py: torch's, or the C
        kernel's once the engine chooses it); deterministic mode's butterflies are here."""
        if x.shape[-1] != self.dim:
            raise ValueError(f"rotation of dim {self.dim} applied to shape {tuple(x.shape)}")
        if self.batch_invariant:
            return _butterflies(x.float(), self.block).to(x.dtype)
        if self.ops is None:
            return self.product(x)
        return self.ops.hadamard(x, self)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """x @ blockdiag(H) over the last dim: one float32 product, cast back (a new tensor)."""
        h = self.block_on(x.device)
        if self.block == self.dim:
            out = torch.matmul(x.float(), h)
        else:
            out = torch.matmul(x.float().unflatten(-1, (-1, self.block)), h).flatten(-2)
        return out.to(x.dtype)


def _butterflies(x: torch.Tensor, block: int) -> torch.Tensor:
    """x @ blockdiag(H_block) by the fast Walsh-Hadamard transform: log2(block) stages of
    elementwise sums and differences, so every row gets the same arithmetic."""
    shape = x.shape
    h = 1
    while h < block:
        pairs = x.reshape(*shape[:-1], -1, 2, h)
        x = torch.stack(
            (pairs[..., 0, :] + pairs[..., 1, :], pairs[..., 0, :] - pairs[..., 1, :]), -2
        )
        h *= 2
    return x.reshape(shape) * block**-0.5


@torch.no_grad()
def rotate_input_columns(
    linear: torch.nn.Linear,
    heads: int,
    rotation: HadamardRotation,
    column_scale: torch.Tensor | None = None,
) -> None:
    """The layer now consumes rotated inputs (per head of `rotation.dim` columns).

    `column_scale` (optional, [in]) multiplies the input columns first: it folds
    an elementwise gain of the input (a norm weight) into the layer.
    """
    dim = rotation.dim
    if _fold_in_one_pass(linear.weight, heads * dim, rotation.block, column_scale):
        return
    h = rotation.matrix().to(linear.weight.device)
    weight = linear.weight.float()
    if column_scale is not None:
        weight = weight * column_scale.float().to(weight.device)
    out_features = weight.shape[0]
    # One product for the whole weight: in row chunks it was 16 small products a layer,
    # each a parallel region, which cost a server (passive OpenMP waits) 3 s at start.
    rotated = torch.matmul(weight.view(out_features, heads, dim), h)
    linear.weight.copy_(rotated.view(out_features, heads * dim).to(linear.weight.dtype))


def _fold_in_one_pass(
    weight: torch.Tensor, width: int, block: int, column_scale: torch.Tensor | None
) -> bool:
    """W diag(g) H by the C kernels' butterflies, in place on a float32 or BF16 CPU
    weight, row by row in float32 (the torch product's arithmetic up to summation
    order; BF16 rounded once); False where they cannot (another device or dtype, no
    kernels). The product, its float32 copies and their fresh pages took 0.77 s of a
    2B Kimi-shaped model's start on 2 cores; this pass takes 0.02 s."""
    if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
        return False
    if not weight.is_contiguous() or weight.shape[-1] != width:
        return False
    from engine.cpu_kernels.library import unavailable

    if unavailable():
        return False
    from engine.cpu_kernels.layer_ops import hadamard_

    hadamard_(weight.data, block, gain=column_scale)
    return True
