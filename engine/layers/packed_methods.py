"""Weights kept in their checkpoint's precision: FP8 block-scaled and INT4 group-quantized.

A linear layer whose checkpoint tensors are quantized keeps them as stored
instead of a BF16 copy (Kimi K2.6's INT4 experts would be 4x larger in BF16,
DeepSeek/Kimi K2's FP8 layers 2x). The loader hands such a layer a
`PackedPiece` in place of a tensor: it slices like one (`narrow`, for the
tensor-parallel slices and the fused q/k/v and gate/up shards), and the
layer's method copies it into the layer's packed parameters.

- FP8: `weight` holds the e4m3 values [rows, cols]; `weight_scale` float32
  holds the checkpoint's block grid of scales, one row of column-block
  scales per `scale_rows` weight rows: the block's rows (128) where every
  piece the layer was loaded from starts on a row block of its checkpoint
  tensor and at a layer row that is a multiple of the block (4 bytes per
  128x128 weights, the checkpoint's own: every layer of the real
  checkpoints at TP 1, and their rank slices while those are whole blocks,
  e.g. Kimi K2 / DeepSeek-V3 experts of 2048 rows up to TP 16, GLM-4.5's of
  1536 up to TP 4), else 1, every row with its own block scales (+3% over
  the values, but exact for any slice of rows, such as fused shards or rank
  slices that start inside a block). `col_offset` says where the first
  column sits in its block.
- INT4: `weight_packed` int32 [rows, cols/8] (eight values per word, value + 8,
  low nibble first) and `weight_scale` bf16 [rows, cols/group], exactly as
  Kimi stores them (compressed-tensors pack-quantized, symmetric). Column
  slices must start and end on a group; the loader keeps a layer dense
  (dequantized) where they would not.

Products, chosen per call in `apply`:
- CPU, where the C kernels run (engine/cpu_kernels/packed_matmul.py): INT4
  through `int4_matmul` (int8 activations per group of 32 with VNNI for BF16
  activations, exact float32 weights for float32 ones), its layer's words
  and scales repacked once at load into tiles of 16 rows (each 16-row block
  transposed in place: the same bytes, `layer.int4_tiles`); FP8 through
  `fp8_block_matmul` (weights dequantized 32 at a time in registers, float32
  products) up to `FP8_KERNEL_ROWS` rows of activations, and beyond that by
  chunks of rows dequantized in C and torch's GEMM, whose cost the many rows
  share;
- otherwise (no kernels, other dtypes or devices): a chunk of rows
  dequantized in torch at a time (at most `CHUNK_ROWS` x cols in the
  activation dtype live at once), so memory stays at the checkpoint's bytes.
  On a GPU the Triton kernels take the packed form (engine/gpu_kernels).
"""

from __future__ import annotations

import functools
import importlib.util

import torch
from torch import nn

from engine.cpu_kernels import library as cpu_kernels
from engine.host import bf16_products
from engine.kv.quant import FP8_DTYPE, HALF_TRICK_FACTOR, fp8_bits_to_half
from engine.layers.linear_methods import DenseMethod
from engine.weights.int4_packed import unpack_int4
from engine.weights.packed_pieces import Fp8Piece, Int4Piece

CHUNK_ROWS = 512
# Up to this many activation rows the FP8 kernel multiplies directly; beyond, it
# dequantizes each weight row once per chunk and torch's BF16/float32 GEMM
# multiplies (measured crossover on AVX-512 VNNI/BF16 CPUs: 8 to 16 rows).
FP8_KERNEL_ROWS = 8
TILE_ROWS = 16  # the INT4 kernel's tile of output rows
KERNEL_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def _triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _cpu_kernel_input(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in KERNEL_DTYPES and not cpu_kernels.unavailable()


def _rows_of(x: torch.Tensor) -> torch.Tensor:
    """x [..., K] as a contiguous [M, K]."""
    return x.reshape(-1, x.shape[-1]).contiguous()


def _float_bias(layer: nn.Module) -> torch.Tensor | None:
    return None if layer.bias is None else layer.bias.float()


def _replace_parameter(layer: nn.Module, name: str, shape, dtype) -> None:
    """A meta parameter of the packed shape (storage comes with the rest, at materialization)."""
    if name in layer._parameters:
        del layer._parameters[name]
    layer.register_parameter(
        name, nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
    )


class PackedMethod(DenseMethod):
    """Base of the checkpoint-precision methods: they are loaded from pieces."""

    packed_checkpoint = True

    def load_rows(self, layer: nn.Module, offset: int, piece) -> None:
        raise NotImplementedError

    def _apply_chunked(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """Torch's path: dequantize CHUNK_ROWS rows at a time (the subclass's
        `dequantize`), so at most that many dense rows live at once."""
        out = x.new_empty(*x.shape[:-1], layer.out_features)
        for start in range(0, layer.out_features, CHUNK_ROWS):
            rows = slice(start, min(start + CHUNK_ROWS, layer.out_features))
            out[..., rows] = bf16_products.linear(x, self.dequantize(layer, rows, x.dtype))
        return self._add_bias(layer, out)

    def _add_bias(self, layer: nn.Module, out: torch.Tensor) -> torch.Tensor:
        return out if layer.bias is None else out + layer.bias.to(out.dtype)


class Fp8BlockMethod(PackedMethod):
    """The checkpoint's e4m3 values and block grid of scales (one method per layer).

    Where the grid's rows sit is decided as the pieces arrive, not at install:
    `install` allocates the grid (`scale_rows` = the block's rows), and the first
    piece that does not fit it (one that starts inside a row block of its
    checkpoint tensor, or at a layer row off the block) switches this layer to
    one scale row per weight row, expanding what was loaded already. The layer
    knows its own shards and rank slice, but not where each tensor it is handed
    starts (GLM's concatenated gate_up is cut at each shard's full size, a
    model may narrow a tensor itself); the piece knows, so whatever path loads
    it, the layer stays exact, and aligned layers never hold more than the grid."""

    name = "fp8-block"

    def __init__(self, block: tuple[int, int], col_start: int):
        self.block = block
        self.col_offset = col_start % block[1]
        self.scale_rows = block[0]

    def install(self, layer: nn.Linear) -> None:
        cols = layer.in_features
        blocks = (self.col_offset + cols - 1) // self.block[1] + 1
        grid_rows = -(-layer.out_features // self.scale_rows)
        _replace_parameter(layer, "weight", (layer.out_features, cols), FP8_DTYPE)
        _replace_parameter(layer, "weight_scale", (grid_rows, blocks), torch.float32)
        layer.method = self

    def load_rows(self, layer: nn.Module, offset: int, piece) -> None:
        if not isinstance(piece, Fp8Piece):
            raise ValueError(f"an FP8 block layer was given {type(piece).__name__}")
        if piece.col_offset != self.col_offset or piece.values.shape[1] != layer.in_features:
            raise ValueError("FP8 block piece does not match the layer's columns")
        if tuple(piece.block) != tuple(self.block):
            raise ValueError(f"FP8 piece in blocks of {piece.block}, the layer's are {self.block}")
        count = piece.values.shape[0]
        fits = piece.row_offset == 0 and offset % self.scale_rows == 0
        if self.scale_rows > 1 and not fits:
            self._hold_row_scales(layer)
        with torch.no_grad():
            layer.weight[offset : offset + count].copy_(piece.values)
            if self.scale_rows == 1:
                layer.weight_scale[offset : offset + count].copy_(piece.row_scales())
            else:
                first = offset // self.scale_rows
                layer.weight_scale[first : first + piece.scales.shape[0]].copy_(piece.scales)

    def _hold_row_scales(self, layer: nn.Module) -> None:
        """One scale row per weight row from now on; rows loaded so far keep their scales."""
        rows = self.row_scales(layer, 0, layer.out_features)
        layer.weight_scale = nn.Parameter(rows.clone(), requires_grad=False)
        self.scale_rows = 1

    def row_scales(self, layer: nn.Module, start: int, stop: int) -> torch.Tensor:
        """float32 [stop - start, column blocks]: the scales of each of these rows."""
        grid, every = layer.weight_scale, self.scale_rows
        if every == 1:
            return grid[start:stop]
        first = start // every
        expanded = grid[first : -(-stop // every)].repeat_interleave(every, dim=0)
        return expanded[start - first * every : stop - first * every]

    def dequantize(self, layer: nn.Module, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        start, stop, _ = rows.indices(layer.out_features)
        values = fp8_bits_to_half(layer.weight[start:stop])  # exact, value * 2**-8
        cols = layer.in_features
        scales = (self.row_scales(layer, start, stop) * HALF_TRICK_FACTOR).repeat_interleave(
            self.block[1], dim=1
        )[:, self.col_offset : self.col_offset + cols]
        return (values.float() * scales).to(dtype)

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and _triton_available():
            grid = self._block_grid(layer)
            if grid is not None:
                from engine.layers.gpu_linear import fp8_linear

                return fp8_linear(layer, x, grid, self.block)
        if _cpu_kernel_input(x) and self.block[1] >= 32:
            return self._apply_cpu_kernels(layer, x)
        return self._apply_chunked(layer, x)

    def _block_grid(self, layer: nn.Linear):
        """The [row blocks, column blocks] scales the GPU kernel reads (None where the
        layer has none: the chunked path then). Per-row scales' grid is derived once."""
        from engine.layers.gpu_linear import fp8_block_grid

        if self.scale_rows > 1:
            return fp8_block_grid(layer)
        if not hasattr(self, "_grid"):
            self._grid = fp8_block_grid(layer)
        return self._grid

    def _apply_cpu_kernels(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        from engine.cpu_kernels.packed_matmul import fp8_block_dequantize, fp8_block_matmul

        flat = _rows_of(x)
        weight, scales, every = layer.weight, layer.weight_scale, self.scale_rows
        layout = self.col_offset, self.block[1], every
        if flat.shape[0] <= FP8_KERNEL_ROWS:
            out = fp8_block_matmul(flat, weight, scales, *layout, _float_bias(layer))
            return out.reshape(*x.shape[:-1], layer.out_features)
        out = flat.new_empty(flat.shape[0], layer.out_features)
        # Chunks of whole scale rows, so each starts on a row of the grid.
        chunk = min(max(CHUNK_ROWS // every, 1) * every, layer.out_features)
        buffer = torch.empty(chunk, layer.in_features, dtype=x.dtype)
        for start in range(0, layer.out_features, chunk):
            rows = slice(start, min(start + chunk, layer.out_features))
            count = rows.stop - rows.start
            grid_rows = slice(start // every, -(-rows.stop // every))
            dense = fp8_block_dequantize(
                weight[rows], scales[grid_rows], *layout, x.dtype, buffer[:count]
            )
            out[:, rows] = bf16_products.linear(flat, dense)
        return self._add_bias(layer, out.reshape(*x.shape[:-1], layer.out_features))

    def weight_bytes(self, layer: nn.Linear) -> int:
        return layer.weight.numel() + layer.weight_scale.numel() * 4


class Int4GroupMethod(PackedMethod):
    """INT4 words and BF16 group scales as the checkpoint stores them.

    On CPU, where the C kernels run and the rows split into tiles of 16 (every
    fused shard included), `load_rows` writes each 16-row block of words and
    scales transposed (engine/cpu_kernels/packed_matmul.py `tile_rows`) and
    sets `layer.int4_tiles`: the same bytes, in the order `int4_matmul` reads.
    `dequantize` reads either order. `cpu_activations` says how BF16
    activations meet the weights: "int8" (per 32 values, VNNI; what the
    engine's CPU grid weights use by default) or "float" (exact float32
    weights times float32 activations); float32 activations always take
    "float", so a float32 model computes what the dequantized one does."""

    name = "int4-group"
    cpu_activations = "int8"

    def __init__(self, group: int):
        self.group = group
        self.tileable = False

    def install(self, layer: nn.Linear) -> None:
        rows, cols = layer.out_features, layer.in_features
        _replace_parameter(layer, "weight", (0, cols), torch.bfloat16)  # no dense copy
        _replace_parameter(layer, "weight_packed", (rows, cols // 8), torch.int32)
        _replace_parameter(layer, "weight_scale", (rows, cols // self.group), torch.bfloat16)
        # Pieces are copied one fused shard at a time: tiles must not straddle two.
        bounds = [rows, *(b for pair in getattr(layer, "shard_offsets", {}).values() for b in pair)]
        self.tileable = self.group % 32 == 0 and all(b % TILE_ROWS == 0 for b in bounds)
        layer.int4_tiles = False
        layer.method = self

    def load_rows(self, layer: nn.Module, offset: int, piece) -> None:
        if not isinstance(piece, Int4Piece):
            raise ValueError(f"an INT4 layer was given {type(piece).__name__}")
        if piece.cols != layer.in_features or piece.group != self.group:
            raise ValueError("INT4 piece does not match the layer's columns or group")
        rows = slice(offset, offset + piece.packed.shape[0])
        packed, scales = piece.packed, piece.scales
        if self.tileable and layer.weight_packed.device.type == "cpu":
            layer.int4_tiles = not cpu_kernels.unavailable()
        if layer.int4_tiles:
            from engine.cpu_kernels.packed_matmul import tile_rows

            packed, scales = tile_rows(packed), tile_rows(scales)
        with torch.no_grad():
            layer.weight_packed[rows].copy_(packed)
            layer.weight_scale[rows].copy_(scales)

    def checkpoint_form(self, layer: nn.Module, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(words, scales) of `rows` in the checkpoint's order, whichever order the layer keeps."""
        packed, scales = layer.weight_packed, layer.weight_scale
        if not getattr(layer, "int4_tiles", False):
            return packed[rows], scales[rows]
        from engine.cpu_kernels.packed_matmul import untile_rows

        start, stop, _ = rows.indices(packed.shape[0])
        first = start // TILE_ROWS * TILE_ROWS
        last = -(-stop // TILE_ROWS) * TILE_ROWS
        within = slice(start - first, stop - first)
        return (
            untile_rows(packed[first:last])[within],
            untile_rows(scales[first:last])[within],
        )

    def dequantize(self, layer: nn.Module, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        packed, scales = self.checkpoint_form(layer, rows)
        values = unpack_int4(packed, layer.in_features).float()
        scales = scales.float().repeat_interleave(self.group, dim=1)
        return (values * scales).to(dtype)

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and _triton_available():  # CUDA layers keep the checkpoint's order
            from engine.layers.gpu_linear import int4_linear

            return int4_linear(layer, x, self.group)
        if getattr(layer, "int4_tiles", False) and _cpu_kernel_input(x):
            return self._apply_cpu_kernel(layer, x)
        return self._apply_chunked(layer, x)

    def _apply_cpu_kernel(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        from engine.cpu_kernels.packed_matmul import int4_matmul

        int8 = x.dtype == torch.bfloat16 and self.cpu_activations == "int8"
        out = int4_matmul(
            _rows_of(x),
            layer.weight_packed,
            layer.weight_scale,
            self.group,
            _float_bias(layer),
            int8_activations=int8,
        )
        return out.reshape(*x.shape[:-1], layer.out_features)

    def weight_bytes(self, layer: nn.Linear) -> int:
        return layer.weight_packed.numel() * 4 + layer.weight_scale.numel() * 2


def is_packed_method(method) -> bool:
    return getattr(method, "packed_checkpoint", False)
