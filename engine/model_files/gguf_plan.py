"""Where each Hugging Face tensor of a GGUF model comes from: the tensor plan.

A GGUF tensor is read here as a matrix of rows: its dimensions in numpy order
(the reverse of GGUF's), all but the last flattened into rows, the last (the
one quant blocks run along) the columns; a 1-D tensor (norm gain, bias) is a
column, one value per row. A row is therefore always whole quant blocks, and
every Hugging Face tensor the engine serves is made of rows of GGUF tensors:

- a tensor stored as is: all rows of one GGUF tensor;
- one expert of a stacked `ffn_*_exps` tensor: a run of its rows;
- llama's Q/K (llama.cpp interleaves the two rotary halves of each head):
  the same rows in another order;
- a tensor llama.cpp fused (`attn_qkv`, `ffn_gate_up_exps`) or one it split:
  a run of rows, or the rows of two GGUF tensors one after the other.

`TensorPlan` says that, per Hugging Face tensor, so a loader can copy the
selected rows' packed blocks as they are. Only where rows cannot express it
does a `Piece` carry a transform on the dequantized values: DeepSeek's
`attn_k_b` holds each head's key projection transposed, so rebuilding
`kv_b_proj` from it needs those values (`"transpose"`).

`Planner` builds a file's plans (gguf_families.py, gguf_moe.py); `materialize`
runs a plan in float32 (what gguf_convert.py writes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine.errors import ModelError

REFETCH_HINT = "download the file again (or run `resident models pull` for the default model)"
ORIGINAL_FOLDER = "use the original Hugging Face model folder instead"
# A model folder made for a GGUF file (engine/model_files/store.py) links the file under
# this name; the loader reads its weights from it (engine/models/gguf_loader.py).
GGUF_WEIGHTS = "model.gguf"
Transform = Literal["transpose"]
Rows = range | tuple[int, ...]


@dataclass(frozen=True)
class Piece:
    """Rows of one GGUF tensor's row view, in this order, optionally transformed.

    `transform="transpose"` transposes the dequantized [rows, columns] block the
    rows select (a packed loader must dequantize such a piece).
    """

    source: str
    rows: Rows
    transform: Transform | None = None

    def shape(self, columns: int) -> tuple[int, int]:
        """The [rows, columns] block this piece adds, given its source's column count."""
        if self.transform == "transpose":
            return columns, len(self.rows)
        return len(self.rows), columns


@dataclass(frozen=True)
class TensorPlan:
    """One Hugging Face tensor: its pieces' blocks stacked by rows, reshaped to `shape`."""

    name: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def sources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(piece.source for piece in self.pieces))

    @property
    def rows_only(self) -> bool:
        """Whether the tensor is rows of GGUF tensors alone (packed blocks can be kept)."""
        return all(piece.transform is None for piece in self.pieces)


def row_view_shape(numpy_shape: Sequence[int]) -> tuple[int, int]:
    """[rows, columns] of a tensor whose dimensions, in numpy order, are `numpy_shape`."""
    if len(numpy_shape) == 1:
        return int(numpy_shape[0]), 1
    return math.prod(int(d) for d in numpy_shape[:-1]), int(numpy_shape[-1])


def whole(name: str, source: str, numpy_shape: Sequence[int]) -> TensorPlan:
    """The GGUF tensor as it is."""
    rows, _ = row_view_shape(numpy_shape)
    return TensorPlan(name, tuple(int(d) for d in numpy_shape), (Piece(source, range(rows)),))


def row_run(start: int, count: int) -> range:
    return range(start, start + count)


def rotary_unpermuted(rows: int, heads: int, start: int = 0) -> tuple[int, ...]:
    """Row order that undoes llama.cpp's Q/K permutation (convert_hf_to_gguf's `permute`).

    llama.cpp stores each head's rows as interleaved pairs (first half, second
    half, first, second, ...); transformers keeps the two rotary halves apart.
    Hugging Face row h*d + p*d/2 + i is GGUF row h*d + 2i + p (d = rows per head).
    """
    per_head = rows // heads
    order = np.arange(rows).reshape(heads, per_head // 2, 2).swapaxes(1, 2).reshape(-1)
    return tuple(int(i) + start for i in order)


def check_shapes(plans: Iterable[TensorPlan], shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """Problems with `plans` against the GGUF tensors' numpy shapes (empty when sound)."""
    problems = []
    for plan in plans:
        blocks = []
        for piece in plan.pieces:
            if piece.source not in shapes:
                problems.append(f"{plan.name}: no GGUF tensor {piece.source}")
                continue
            rows, columns = row_view_shape(shapes[piece.source])
            low, high = _row_bounds(piece.rows)
            if len(piece.rows) and (low < 0 or high >= rows):
                problems.append(f"{plan.name}: rows outside {piece.source}'s {rows}")
            blocks.append(piece.shape(columns))
        if len({columns for _, columns in blocks}) > 1:
            problems.append(f"{plan.name}: its pieces differ in width ({blocks})")
        elif blocks:
            size = sum(r for r, _ in blocks) * blocks[0][1]
            if size != math.prod(plan.shape):
                problems.append(
                    f"{plan.name}: the pieces hold {size} values, the shape {plan.shape} "
                    f"needs {math.prod(plan.shape)}"
                )
    return problems


def _row_bounds(rows: Rows) -> tuple[int, int]:
    """(min, max) of the rows, a range's from its ends without walking it (a model's
    expert pieces: 0.2 s a start); (0, -1) for none."""
    if not len(rows):
        return 0, -1
    if isinstance(rows, range):
        return min(rows[0], rows[-1]), max(rows[0], rows[-1])
    return min(rows), max(rows)


def materialize(
    plan: TensorPlan, dequantize_rows: Callable[[str, np.ndarray | slice], np.ndarray]
) -> np.ndarray:
    """The tensor in float32. `dequantize_rows(source, rows)` gives those rows of the
    source's row view as a float32 [rows, columns] array."""
    blocks = []
    for piece in plan.pieces:
        rows = piece.rows
        selection = (
            slice(rows.start, rows.stop)
            if isinstance(rows, range) and rows.step == 1
            else np.asarray(rows, dtype=np.int64)
        )
        block = dequantize_rows(piece.source, selection)
        blocks.append(block.T if piece.transform == "transpose" else block)
    values = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
    return np.ascontiguousarray(values, dtype=np.float32).reshape(plan.shape)


class Planner:
    """Builds the tensor plans of one file and keeps count of the GGUF tensors used."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], num_layers: int, mtp_layers: int = 0):
        self.shapes = shapes
        self.num_layers = num_layers
        self.mtp_layers = mtp_layers
        self.plans: list[TensorPlan] = []
        self.used: set[str] = set()
        self.redundant: set[str] = set()

    def has(self, source: str) -> bool:
        return source in self.shapes

    def require(self, source: str) -> tuple[int, ...]:
        if source not in self.shapes:
            raise ModelError(f"GGUF lacks tensor {source}; {REFETCH_HINT}.")
        return self.shapes[source]

    def expect(self, source: str, numpy_shape: Sequence[int], what: str) -> None:
        """Refuse a tensor whose shape (numpy order) is not what the metadata implies."""
        shape = self.require(source)
        if tuple(shape) != tuple(numpy_shape):
            raise ModelError(
                f"GGUF tensor {source} has shape {list(shape)}, but the metadata makes {what} "
                f"{list(numpy_shape)}; the file is inconsistent ({REFETCH_HINT})."
            )

    def rows(self, name: str, source: str, rows: Rows | None = None) -> None:
        """`name` is rows of `source` (all of them by default): a vector or a matrix."""
        numpy_shape = self.require(source)
        total, columns = row_view_shape(numpy_shape)
        rows = range(total) if rows is None else rows
        shape = (len(rows),) if len(numpy_shape) == 1 else (len(rows), columns)
        self.add(name, shape, (Piece(source, rows),))

    def add(self, name: str, shape: Sequence[int], pieces: Sequence[Piece]) -> None:
        self.plans.append(TensorPlan(name, tuple(int(d) for d in shape), tuple(pieces)))
        self.used.update(piece.source for piece in pieces)

    def optional(self, name: str, source: str) -> bool:
        if not self.has(source):
            return False
        self.rows(name, source)
        return True

    def finish(self, architecture: str) -> tuple[tuple[TensorPlan, ...], tuple[str, ...]]:
        """The plans in file order, and the tensors left out (multi-token prediction layers)."""
        mtp = range(self.num_layers, self.num_layers + self.mtp_layers)
        skipped = [n for n in self.shapes if n not in self.used and _block_index(n) in mtp]
        skipped += sorted(self.redundant - self.used)
        unknown = [n for n in self.shapes if n not in self.used and n not in skipped]
        if unknown:
            raise ModelError(
                f"GGUF tensor {unknown[0]!r} has no place in a {architecture} model the engine "
                f"serves ({len(unknown)} such tensors); {ORIGINAL_FOLDER}."
            )
        if problems := check_shapes(self.plans, self.shapes):
            raise ModelError(f"GGUF tensors do not fit the model: {problems[0]}; {REFETCH_HINT}.")
        order = {name: index for index, name in enumerate(self.shapes)}
        plans = sorted(self.plans, key=lambda plan: order[plan.pieces[0].source])
        return tuple(plans), tuple(skipped)


def _block_index(name: str) -> int:
    """N of a `blk.N.*` tensor, -1 for the others."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and parts[1].isdigit() else -1
