"""A model's weights read straight from its GGUF file, quant blocks kept packed.

The file is memory-mapped (gguf's reader) and its tensor plan
(engine/model_files/gguf_plan.py) says which rows of which GGUF tensors make
each Hugging Face tensor. Two kinds of layer:

- A linear layer whose every piece is rows of Q4_0, Q4_1, Q8_0, Q5_0 or Q5_1
  tensors, or rows of K-quant tensors of one type (Q4_K, Q5_K, Q6_K), with the
  CPU grid kernel in use, is given its grid method before any memory is
  allocated for it: the blocks' codes and scales go from the mapped file
  straight into the kernel's layout, in C (engine/weights/gguf_blocks.py,
  gguf_repack.c, gguf_kquant_repack.c), exact, and no dense copy of the
  weight ever exists.
- Everything else (norms, embeddings, routers, float tensors, a fused layer
  whose parts mix a K-quant with another type, a tensor that needs a transform
  such as DeepSeek's transposed `attn_k_b`) is dequantized one tensor at a time
  and loaded like a safetensors tensor, split over the ranks as usual.

So start-up reads the file once and holds about its bytes, where converting
to a float32 folder first wrote four bytes a weight to disk and read them back.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType
from torch import nn

from engine.cpu_kernels.library import unavailable
from engine.cpu_kernels.mla_decode import LatentGrid
from engine.host.memory_advice import MappedFile, PackedArena
from engine.layers.cpu_grid_weights import MAX_PACKED_ROWS, GridMethod, GridParts, GridWeight
from engine.layers.linear import FusedLinear
from engine.layers.linear_methods import DENSE, MethodLinear
from engine.model_files.gguf_convert import dequantized_rows, read_gguf
from engine.model_files.gguf_plan import TensorPlan, materialize, row_view_shape
from engine.weights.gguf_blocks import (
    BLOCK_TYPES,
    BlockRows,
    GridRows,
    decode_blocks,
    join_block_rows,
    join_rows,
    offsets_exact,
    pack_grid_rows,
    repack_block_rows,
    repack_kquant_rows,
)
from engine.weights.gguf_kquants import (
    KQUANT_TYPES,
    KQuantRows,
    decode_kquant_blocks,
    join_kquant_rows,
    pack_kquant_rows,
)

log = logging.getLogger(__name__)


class GGUFWeights:
    """One GGUF file's tensors, read through its plan."""

    def __init__(self, path: Path):
        self.path = Path(path)
        reader, _, model = read_gguf(self.path)
        self.tensors = {tensor.name: tensor for tensor in reader.tensors}
        self.plans = model.plans
        self.packed: set[str] = set()  # Hugging Face names whose blocks a layer holds
        self.arena = PackedArena()
        self.mapped = MappedFile(reader.data)

    def _type_name(self, source: str) -> str:
        return GGMLQuantizationType(self.tensors[source].tensor_type).name

    def grid_rows(self, plan: TensorPlan) -> BlockRows | GridRows | KQuantRows | None:
        """The plan's rows as grid codes (plain blocks: still in the file, for the C
        repacker), or None unless every piece is rows of blocks the grid kernel
        multiplies as they are."""
        types = {self._type_name(source) for source in plan.sources}
        if not plan.rows_only or not (types <= BLOCK_TYPES.keys() or types <= KQUANT_TYPES.keys()):
            return None
        parts = []
        for piece in plan.pieces:
            tensor = self.tensors[piece.source]
            total, columns = row_view_shape(tuple(reversed(tensor.shape.tolist())))
            type_name = self._type_name(piece.source)
            if not unavailable():
                view = tensor.data.reshape(total, -1)
                parts.append(BlockRows([(view, _selection(piece.rows), type_name)], columns))
                continue
            rows = tensor.data.reshape(total, -1)[_selection(piece.rows)]
            decode = decode_blocks if type_name in BLOCK_TYPES else decode_kquant_blocks
            parts.append(decode(rows, type_name, columns))
        return _join(parts)

    def grid_tensor(self, source: str) -> GridWeight | None:
        """A whole GGUF tensor (its row view) as a grid weight, or None when the file lacks
        it or holds it in blocks the grid kernel does not multiply as they are."""
        tensor = self.tensors.get(source)
        if tensor is None:
            return None
        type_name = self._type_name(source)
        if type_name not in BLOCK_TYPES and type_name not in KQUANT_TYPES:
            return None
        total, columns = row_view_shape(tuple(reversed(tensor.shape.tolist())))
        view = tensor.data.reshape(total, -1)
        if not unavailable():
            return self.grid_weight(BlockRows([(view, slice(0, total), type_name)], columns))
        decode = decode_blocks if type_name in BLOCK_TYPES else decode_kquant_blocks
        return self.grid_weight(decode(view, type_name, columns))

    def grid_weight(self, rows: BlockRows | GridRows | KQuantRows) -> GridWeight | None:
        """The rows packed for the grid kernel, or None when they are not exact on it."""
        if isinstance(rows, BlockRows) and rows.kind in KQUANT_TYPES:
            fmt = KQUANT_TYPES[rows.kind][1]
            codes, scales = repack_kquant_rows(rows, self.arena.take, self.mapped)
            return GridWeight(codes, scales, fmt.bits, rows.rows, fmt.name, format=fmt)
        if isinstance(rows, BlockRows):
            packed = repack_block_rows(rows, self.arena.take, self.mapped)
            if packed is None:
                return None
            return GridWeight(*packed, rows.bits, rows.rows, f"{rows.bits}-bit")
        if isinstance(rows, KQuantRows):
            codes, scales = pack_kquant_rows(rows)
            fmt = rows.format
            return GridWeight(codes, scales, fmt.bits, rows.rows, fmt.name, format=fmt)
        if not offsets_exact(rows):
            return None
        codes, scales = pack_grid_rows(rows)
        return GridWeight(codes, scales, rows.bits, rows.rows, f"{rows.bits}-bit")

    def dense(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor no layer holds packed, dequantized to float32, one at a time."""
        for plan in self.plans:
            if plan.name in self.packed:
                continue
            values = materialize(plan, self._rows)
            if not values.flags.writeable:  # a float32 tensor still in the mapped file
                values = values.copy()
            self.mapped.release()
            yield plan.name, torch.from_numpy(values)

    def _rows(self, source: str, selection) -> np.ndarray:
        """Rows in float32: blocks this module reads decoded by its own numpy decoders
        (whole arrays; the same values, tested against gguf), others by gguf's."""
        tensor, type_name = self.tensors[source], self._type_name(source)
        decode = _DECODERS.get(type_name)
        if decode is None:
            return dequantized_rows(tensor, selection)
        total, columns = row_view_shape(tuple(reversed(tensor.shape.tolist())))
        rows = decode(tensor.data.reshape(total, -1)[selection], type_name, columns)
        if isinstance(rows, GridRows) and not offsets_exact(rows):  # -128 d overflowed half
            return dequantized_rows(tensor, selection)
        return rows.values()


_DECODERS = {
    **{type_name: decode_blocks for type_name in BLOCK_TYPES},
    **{type_name: decode_kquant_blocks for type_name in KQUANT_TYPES},
}


def _join(parts: list) -> BlockRows | GridRows | KQuantRows | None:
    """One layer's rows from its parts: plain grids join (4-bit codes as 8-bit beside
    8-bit ones), K-quants only with their own type."""
    if all(isinstance(part, BlockRows) for part in parts):
        return join_block_rows(parts)
    if all(isinstance(part, GridRows) for part in parts):
        return join_rows(parts)
    return join_kquant_rows(parts)


def _columns(rows: BlockRows | GridRows | KQuantRows) -> int:
    return rows.columns if isinstance(rows, BlockRows) else rows.codes.shape[1] * 32


def _decoder_layer(name: str) -> str:
    """`model.layers.3` of `model.layers.3.mlp.experts.7.down_proj`; the name otherwise."""
    parts = name.split(".")
    return ".".join(parts[:3]) if len(parts) > 3 and parts[2].isdigit() else name


def _selection(rows) -> slice | np.ndarray:
    if isinstance(rows, range) and rows.step == 1:
        return slice(rows.start, rows.stop)
    return np.asarray(rows, dtype=np.int64)


def install_grid_layers(model: nn.Module, weights: GGUFWeights) -> set[str]:
    """Give every dense linear layer whose checkpoint tensors are all grid blocks its grid
    method, built from the blocks; returns the parameters it filled (the loader's names,
    `name:shard` for a fused layer's pieces). Call before the parameters are allocated."""
    by_layer: dict[str, dict] = defaultdict(dict)
    for plan in weights.plans:
        if not plan.name.endswith(".weight") or model.skip_checkpoint_tensor(plan.name):
            continue
        target, shard = model.checkpoint_target(plan.name)
        by_layer[target[: -len(".weight")]][shard] = plan
    filled: set[str] = set()
    counts: Counter[str] = Counter()
    block = None
    for layer_name, shards in by_layer.items():
        # A decoder layer's blocks packed, the file's pages they came from are dropped:
        # the file and its packed copy are never both resident.
        if _decoder_layer(layer_name) != block:
            weights.mapped.release()
            block = _decoder_layer(layer_name)
        try:
            layer = model.get_submodule(layer_name)
        except AttributeError:
            continue
        order = _shard_order(layer, shards)
        if order is None:
            continue
        parts = [weights.grid_rows(shards[shard]) for shard in order]
        if any(part is None or _columns(part) != layer.in_features for part in parts):
            continue
        rows = _join(parts)
        if rows is not None:
            packed = weights.grid_weight(rows)
        else:  # pieces in formats no one layout holds: a grid weight each
            pieces = [weights.grid_weight(part) for part in parts]
            packed = None if any(p is None for p in pieces) else GridParts(pieces)
        if packed is None or packed.rows != layer.out_features:
            continue
        layer.method = GridMethod(packed, MAX_PACKED_ROWS)
        # No dense copy: an empty weight stays in its place, as grid packing leaves it.
        layer.weight = nn.Parameter(
            torch.empty((0, layer.in_features), dtype=layer.weight.dtype), requires_grad=False
        )
        weights.packed.update(shards[shard].name for shard in order)
        target = f"{layer_name}.weight"
        filled.update(target if shard is None else f"{target}:{shard}" for shard in order)
        counts[packed.grid] += 1
    weights.mapped.release()
    log.info(
        "GGUF blocks kept packed: %s",
        ", ".join(f"{n} layers {grid}" for grid, n in sorted(counts.items())) or "none",
    )
    return filled


def install_grid_embedding(model: nn.Module, weights: GGUFWeights) -> set[str]:
    """Keep the token embedding in its file's blocks when they are on a grid and the head
    does not share it: rows are dequantized as they are looked up (the values the
    dequantized table would hold). Returns the parameter it filled. Call before the
    parameters are allocated, so no float copy of the table is ever made."""
    embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
    if embedding is None or getattr(model, "tie_word_embeddings", False):
        return set()
    for plan in weights.plans:
        if plan.name.endswith(".weight") and not model.skip_checkpoint_tensor(plan.name):
            target, shard = model.checkpoint_target(plan.name)
            if target == "model.embed_tokens.weight" and shard is None:
                break
    else:
        return set()
    rows = weights.grid_rows(plan)
    if rows is None or _columns(rows) != embedding.hidden_size:
        return set()
    packed = weights.grid_weight(rows)
    if packed is None or packed.rows != embedding.vocab_size:
        return set()
    embedding.use_grid(packed)
    weights.packed.add(plan.name)
    weights.mapped.release()
    log.info("token embedding kept as %s GGUF blocks", packed.grid)
    return {target}


def install_latent_grids(model: nn.Module, weights: GGUFWeights) -> int:
    """Give every MLA attention whose file holds `attn_k_b` and `attn_v_b` (W_UK^T and
    W_UV per head, as current converters split kv_b) in grid blocks its LatentGrid: the
    CPU decode kernel multiplies those blocks as they are, a Q4 file's at a quarter of
    the bytes of kv_b_proj in BF16 (which stays, rebuilt dense, for prefill and the
    other paths). Returns how many layers took one."""
    count = 0
    for index, layer in enumerate(getattr(model.model, "layers", ())):
        attention = getattr(layer, "self_attn", None)
        if not hasattr(attention, "latent_grid"):
            continue
        k_b = weights.grid_tensor(f"blk.{index}.attn_k_b.weight")
        v_b = weights.grid_tensor(f"blk.{index}.attn_v_b.weight")
        if k_b is None or v_b is None:
            continue
        grid = LatentGrid(k_b, v_b)
        dims = attention.dims  # a tensor-parallel rank's heads are not the file's: no fit
        if grid.fits(dims.num_heads, dims.nope_dim, dims.v_dim, dims.lora_rank):
            attention.use_latent_grid(grid)
            count += 1
    if count:
        log.info("MLA decode reads W_UK and W_UV as GGUF blocks in %d layers", count)
    weights.mapped.release()
    return count


def _shard_order(layer: nn.Module, shards: dict) -> list | None:
    """The layer's pieces in row order, or None when it cannot take grid blocks."""
    if not isinstance(layer, MethodLinear) or layer.method is not DENSE:
        return None
    if getattr(layer, "keeps_dense", False):
        return None  # something else reads its matrix (MLA's kv_b_proj)
    if isinstance(layer, FusedLinear) and None not in shards:
        offsets = layer.shard_offsets
        if set(shards) != set(offsets):
            return None
        return sorted(offsets, key=lambda shard: offsets[shard][0])
    return [None] if set(shards) == {None} else None


def attach_biases(model: nn.Module) -> None:
    """The grid kernel adds a layer's bias itself: hand it the loaded bias (float32)."""
    for module in model.modules():
        method = getattr(module, "method", None)
        if isinstance(method, GridMethod) and getattr(module, "bias", None) is not None:
            packed = method.packed
            if isinstance(packed, GridWeight | GridParts) and packed.bias is None:
                packed.bias = module.bias.detach().float().clone()
