"""Keep 4- and 8-bit checkpoint weights packed on CPU, exactly, and multiply with them.

Checkpoints converted from llama.cpp's block formats (the default model is a
Q4_1 GGUF, with a Q8_0 embedding) hold weights that lie, per group of 32
values along a row, on a small uniform grid: Q4_1 on 16 levels `lo + step * q`
(q in 0..15), Q8_0 on `step * q` (q in -128..127). The float32 model folder
keeps those values exactly, so they can be packed back without loss. Two
kernels read them:

- `int8` (engine/cpu_kernels, AVX-512 VNNI or AVX2): the codes stay 4- or 8-bit with
  scales and offsets in half precision (as the GGUF blocks store them), and
  each row of activations is quantized to int8 per group of 32, as llama.cpp
  does for these files. Integer dot products make it the fastest at every row
  count (a 3072x576 product 2.2x faster than dense BF16 at 16 rows, 6x at one:
  `python bench/cpu_kernels.py`, docs/BENCHMARKS.md), so these layers drop
  their dense weight. The weights are exact; the activations carry int8
  rounding (per group: half a step of max|x|/127; accuracy in
  docs/CPU_KERNELS.md). Where the CPU has AMX, many rows (prefill) go to BF16
  tiles instead (engine/layers/cpu_matrix_path.py).
- `bf16`: torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, BF16
  activations, per-group scale and zero: value = (q - 8) * scale + zero); an
  8-bit grid becomes two 4-bit products (high and low nibbles). It loses to a
  dense BF16 product from about 8 rows on, so each layer keeps its dense
  weight and uses the packed form up to `MAX_PACKED_ROWS` rows. Its scales
  are BF16, so packed values equal the float32 ones within BF16 rounding.

Only grids that reproduce every value of a weight (within float32 rounding)
are packed; anything else, such as an ordinary BF16 checkpoint, stays dense.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.cpu_kernels.grid_matmul import GridFormat, pack_codes
from engine.host import bf16_products
from engine.layers.cpu_matrix_path import grid_product
from engine.layers.linear_methods import DENSE, DenseMethod, MethodLinear

GROUP = 32
# Up to this many rows the packed kernel is used; beyond, the dense weight.
MAX_PACKED_ROWS = 4
# A value lies on the grid when it is within this fraction of a grid step
# (float32 rounding of `step * q + lo` stays far below it; an off-grid value
# of an ordinary checkpoint is a sizeable fraction of a step away).
_STEP_TOLERANCE = 1e-3
_FLOAT32_SLACK = 2.0**-21
_PROBE_ROWS = 8
# torch's int4 packing wants the output rows in multiples of 16.
_KERNEL_ROW_MULTIPLE = 16


@dataclass
class PackedPart:
    """One 4-bit product: packed nibbles [N, K/2] and BF16 (scale, zero) per group."""

    packed: torch.Tensor
    scales_and_zeros: torch.Tensor  # [K / GROUP, N, 2]

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, GROUP, self.scales_and_zeros)


@dataclass
class PackedWeight:
    """A weight as one (4-bit grid) or two (8-bit grid) packed products that sum to it."""

    parts: list[PackedPart]
    grid: str  # "4-bit" or "8-bit"

    @property
    def nbytes(self) -> int:
        return sum(p.packed.numel() + p.scales_and_zeros.numel() * 2 for p in self.parts)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        out = self.parts[0].matmul(x)
        for part in self.parts[1:]:
            out = out + part.matmul(x)
        return out


def _part(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> PackedPart:
    """q [N, K/G, G] in 0..15, scale and zero [N, K/G, 1] in float32."""
    rows = q.shape[0]
    packed = torch._convert_weight_to_int4pack_for_cpu(q.reshape(rows, -1).to(torch.int32), 1)
    scales_and_zeros = torch.cat((scale, zero), dim=-1).transpose(0, 1).contiguous()
    return PackedPart(packed, scales_and_zeros.to(torch.bfloat16))


def _within_grid(error: torch.Tensor, step: torch.Tensor, magnitude: torch.Tensor) -> bool:
    return bool((error <= step.abs() * _STEP_TOLERANCE + magnitude * _FLOAT32_SLACK).all())


def _four_bit_grid(groups: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """(q, step, lo) when every group is `lo + step * q`, q in 0..15, else None.

    Two ways a GGUF block puts a group there, taken group by group:
    - Q4_1 maps the group's minimum to 0 and its maximum to 15: lo = min,
      step = (max - min) / 15.
    - Q4_0 stores d * (q - 8) with d = -v / 8 for v the value of largest
      magnitude, which lands on q = 0: lo = v, step = -v / 8 (negative when v
      is). Its top level, 7d, is reached only when some value rounds to 15,
      which most groups of a random weight never do, so min and max alone
      would miss the grid.

    Each group takes the first reading that reproduces it, preferring one whose
    step and offset are exact in half precision (as the file stored d and m:
    Q4_0's group with a positive extreme read the Q4_1 way would need 7d as
    its offset, which half cannot hold).
    """
    lo = groups.amin(-1, keepdim=True)
    hi = groups.amax(-1, keepdim=True)
    magnitude = lo.abs() + hi.abs()
    anchor = torch.where(hi.abs() > lo.abs(), hi, lo)  # the value of largest magnitude
    readings = [(lo, (hi - lo) / 15), (anchor, -anchor / 8)]
    halves = [(start.half().float(), step.half().float(), 0.0) for start, step in readings]
    chosen = None
    for start, step, tolerance in halves + [(*r, _STEP_TOLERANCE) for r in readings]:
        *grid, fits = _four_bit_fit(groups, start, step, magnitude, tolerance)
        if chosen is None:
            chosen, taken = grid, fits
        else:
            new = fits & ~taken
            chosen = [torch.where(new, a, b) for a, b in zip(grid, chosen, strict=True)]
            taken = taken | fits
        if taken.all():  # a Q4_1 file's weights: the first reading fits them all
            break
    return tuple(chosen) if taken.all() else None


def _four_bit_fit(
    groups, lo, step, magnitude, tolerance: float = _STEP_TOLERANCE
) -> tuple[torch.Tensor, ...]:
    """(q, step, lo, fits) for the grid `lo + step * q`, q in 0..15; `fits` [.., 1] per group.

    `tolerance` is the fraction of a step a value may be off; 0 for the half
    readings, which must reproduce a group to float32 rounding (a half offset a
    little off the group's own would otherwise pass)."""
    q = ((groups - lo) / torch.where(step != 0, step, 1.0)).round_().clamp_(0, 15)
    error = (q * step + lo - groups).abs_()
    bound = step.abs() * tolerance + magnitude * _FLOAT32_SLACK
    return q, step, lo, (error <= bound).all(-1, keepdim=True)


def _eight_bit_grid(groups: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
    """(q, step) when every group is `step * q`, q in -128..127, as Q8_0 writes them."""
    amax = groups.abs().amax(-1, keepdim=True)
    step = amax / 127
    q = (groups / torch.where(step > 0, step, 1.0)).round_().clamp_(-128, 127)
    error = (q * step - groups).abs_()
    return (q, step) if _within_grid(error, step, amax) else None


def _in_half(groups: torch.Tensor, q: torch.Tensor, step: torch.Tensor, *lo: torch.Tensor):
    """The grid with its step (and offset) in IEEE half, as the int8 kernel stores them
    (engine/cpu_kernels/grid_matmul.c), or None unless every value still lies on it.

    llama.cpp's Q4_1 and Q8_0 blocks store d (and m) in half, so a GGUF's grid
    rounds back to its own d and m; float32 scales would cost a 4-bit weight a
    fifth more bytes on every decode step."""
    step16 = step.half().float()
    lo16 = [offset.half().float() for offset in lo]
    # The 8-bit kernel's offset is -128 * step: it must stay finite in half too.
    offsets = lo16 or [(-128 * step16).half().float()]
    if not all(torch.isfinite(t).all() for t in (step16, *offsets)):
        return None
    values = q * step16 + lo16[0] if lo16 else q * step16
    magnitude = groups.abs().amax(-1, keepdim=True)
    if not _within_grid((values - groups).abs_(), step16, magnitude):
        return None
    return (q, step16, *lo16)


@dataclass
class GridWeight:
    """A weight `step * codes + offset` in the int8-activation kernel's layout: a plain
    grid of `bits` (step and offset half per group of 32) unless `format` says which
    other (engine/cpu_kernels/grid_formats.h: llama.cpp's K-quants)."""

    codes: torch.Tensor  # uint8, nibbles for a 4-bit grid
    scales: torch.Tensor  # plain grids: float16 step and offset per group of 32 (see _in_half)
    bits: int  # the codes' width
    rows: int
    grid: str  # for reports: "4-bit", "8-bit", or the K-quant's name
    bias: torch.Tensor | None = None  # float32, added by the kernel
    format: GridFormat | None = None

    def __post_init__(self):
        if self.format is None:
            self.format = GridFormat(self.bits)

    @property
    def nbytes(self) -> int:
        return self.codes.numel() + self.scales.numel() * self.scales.element_size()

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """On VNNI, or on BF16 tiles from many rows where the CPU has AMX
        (engine/layers/cpu_matrix_path.py)."""
        return grid_product(
            x, self.codes, self.scales, self.format, self.rows, self.bias, out_dtype
        )


class GridParts:
    """Grid weights stacked by rows, each in its own format: a fused layer whose pieces a
    GGUF stores in different K-quant types (a Q4_K_M file's Q4_K q/k beside a Q6_K v),
    which no one layout holds exactly. Each part is multiplied on its own and the
    outputs are joined; the fused C decode step takes single grid weights only."""

    grid = "mixed"

    def __init__(self, parts: list[GridWeight]):
        self.parts = parts
        self.rows = sum(part.rows for part in parts)

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in parts) if (parts := self.parts) else 0

    @property
    def bias(self) -> torch.Tensor | None:
        biases = [part.bias for part in self.parts]
        return None if any(b is None for b in biases) else torch.cat(biases)

    @bias.setter
    def bias(self, bias: torch.Tensor | None) -> None:
        for part, piece in zip(self.parts, _row_pieces(bias, self.parts), strict=True):
            part.bias = piece

    def matmul(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.cat([part.matmul(x, out_dtype) for part in self.parts], dim=-1)


def _row_pieces(values: torch.Tensor | None, parts: list[GridWeight]) -> list:
    if values is None:
        return [None] * len(parts)
    return list(values.split([part.rows for part in parts]))


def _grid_four_bit(q: torch.Tensor, step: torch.Tensor, lo: torch.Tensor) -> GridWeight:
    codes, scales = pack_codes(q, step, lo, bits=4)
    return GridWeight(codes, scales, 4, q.shape[0], "4-bit")


def _grid_eight_bit(q: torch.Tensor, step: torch.Tensor) -> GridWeight:
    # The kernel multiplies unsigned codes: q + 128 in 0..255, offset -128 step.
    codes, scales = pack_codes(q + 128, step, -128 * step, bits=8)
    return GridWeight(codes, scales, 8, q.shape[0], "8-bit")


def _pack_four_bit(q: torch.Tensor, step: torch.Tensor, lo: torch.Tensor) -> PackedWeight:
    # The kernel computes (q - 8) * scale + zero.
    return PackedWeight([_part(q, step, lo + 8 * step)], "4-bit")


def _pack_eight_bit(q: torch.Tensor, step: torch.Tensor) -> PackedWeight:
    high = torch.div(q, 16, rounding_mode="floor")  # -8..7
    low = q - 16 * high  # 0..15
    zeros = torch.zeros_like(step)
    # high: ((high + 8) - 8) * 16 step; low: (low - 8) * step + 8 step.
    return PackedWeight(
        [_part(high + 8, 16 * step, zeros), _part(low, step, 8 * step)],
        "8-bit",
    )


KERNELS = ("int8", "bf16")


def pack_if_on_grid(weight: torch.Tensor, kernel: str = "bf16") -> PackedWeight | GridWeight | None:
    """The packed form of a float32 [N, K] weight whose groups lie on a grid, else None.

    kernel: "int8" (int8 activations, cpu_grid_kernel) or "bf16" (torch's int4 kernel).
    """
    if kernel not in KERNELS:
        raise ValueError(f"unknown CPU kernel {kernel!r}; choose from {', '.join(KERNELS)}")
    if (
        weight.dim() != 2
        or weight.dtype != torch.float32
        or weight.shape[1] % GROUP
        or (kernel == "bf16" and weight.shape[0] % _KERNEL_ROW_MULTIPLE)
    ):
        return None
    groups = weight.detach().reshape(weight.shape[0], -1, GROUP)
    packers = (
        ((_four_bit_grid, _grid_four_bit), (_eight_bit_grid, _grid_eight_bit))
        if kernel == "int8"
        else ((_four_bit_grid, _pack_four_bit), (_eight_bit_grid, _pack_eight_bit))
    )
    # An ordinary checkpoint fails on its first rows: test those before the whole weight.
    probe = groups[:_PROBE_ROWS]
    for on_grid, pack in packers:
        if on_grid(probe) is not None:
            grid = on_grid(groups)
            if grid is not None and kernel == "int8":
                grid = _in_half(groups, *grid)
            return None if grid is None else pack(*grid)
    return None


class GridMethod(DenseMethod):
    """A CPU grid-packed weight (GridWeight: int8 activations; PackedWeight: torch's
    int4 kernel up to a few rows, the dense weight beyond)."""

    name = "cpu-grid"

    def __init__(self, packed, max_packed_rows: int):
        self.packed = packed
        self.max_packed_rows = max_packed_rows

    def apply(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        packed = self.packed
        if isinstance(packed, GridWeight | GridParts):
            flat = x.reshape(rows, x.shape[-1])
            if flat.dtype not in (torch.float32, torch.bfloat16):
                flat = flat.float()
            out = packed.matmul(flat.contiguous())  # the kernel adds the bias
            return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)
        if rows > self.max_packed_rows:
            return bf16_products.linear(x, layer.weight, layer.bias)
        flat = x.reshape(rows, x.shape[-1]).to(torch.bfloat16).contiguous()
        out = packed.matmul(flat)
        if layer.bias is not None:
            out = out + layer.bias
        return out.reshape(*x.shape[:-1], out.shape[-1]).to(x.dtype)

    def logits(self, layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        """The int8 kernel writes float32 logits from its accumulators: no BF16
        rounding of the logits and no copy to cast them back."""
        packed = self.packed
        if not isinstance(packed, GridWeight | GridParts) or x.dtype not in (
            torch.float32,
            torch.bfloat16,
        ):
            return super().logits(layer, x)
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        return packed.matmul(flat, torch.float32).reshape(*x.shape[:-1], packed.rows)

    def weight_bytes(self, layer: nn.Linear) -> int:
        return self.packed.nbytes + super().weight_bytes(layer)

    def bytes_beside(self, layer: nn.Linear) -> int:
        return self.packed.nbytes


def grid_weight_of(layer: nn.Module):
    """The CPU grid-packed weight a layer multiplies with, or None."""
    method = getattr(layer, "method", None)
    return method.packed if isinstance(method, GridMethod) else None


def pack_grid_weights(model: nn.Module, kernel: str = "bf16") -> dict[str, int]:
    """Give every float32 linear layer whose weight lies on a 4- or 8-bit grid a grid method.

    Call on the float32 model before casting it to BF16. Returns counts and
    bytes for the start-up log. A weight shared by two modules (tied
    embeddings) is packed once per Linear that uses it. The int8 kernel
    serves every row count, so its layers drop their dense weight (an empty
    tensor stays in its place) unless another module, such as a tied
    embedding, reads it. A layer marked `keeps_dense` (MLA's kv_b_proj, whose
    matrix attention reads) is left dense.
    """
    report = {"4-bit": 0, "8-bit": 0, "dense": 0, "packed_bytes": 0, "dropped_bytes": 0}
    shared = {
        id(param)
        for module in model.modules()
        if not isinstance(module, nn.Linear)
        for param in module.parameters(recurse=False)
    }
    for module in model.modules():
        if not isinstance(module, MethodLinear) or module.method is not DENSE:
            continue
        if getattr(module, "keeps_dense", False):  # something else reads its matrix (MLA's kv_b)
            report["dense"] += 1
            continue
        packed = pack_if_on_grid(module.weight, kernel)
        if packed is None:
            report["dense"] += 1
            continue
        if isinstance(packed, GridWeight) and module.bias is not None:
            packed.bias = module.bias.detach().float().clone()
        module.method = GridMethod(packed, MAX_PACKED_ROWS)
        report[packed.grid] += 1
        report["packed_bytes"] += packed.nbytes
        if isinstance(packed, GridWeight) and id(module.weight) not in shared:
            report["dropped_bytes"] += module.weight.numel() * 2  # what BF16 would have held
            module.weight.data = module.weight.data.new_empty((0, module.in_features))
    return report


def is_packed(module: nn.Module) -> bool:
    return grid_weight_of(module) is not None
