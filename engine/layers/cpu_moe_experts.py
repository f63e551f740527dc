"""A MoE block's routed experts on CPU in one C call (engine/cpu_kernels/moe_experts.c).

`SparseMoE.run_experts` loops over the experts in Python: per expert a
gather, two grid products, SwiGLU, a weighted scatter. At one decode token
with 8 experts the Python and the 9 OpenMP regions cost as much again as the
products (bench/cpu_kernels.py moe_experts). When every routed expert's
gate_up_proj and down_proj are grid weights (engine/layers/cpu_grid_weights.py
GridWeight) of one format and shape, `CpuMoeExperts` describes them to C
once (pointers to codes and scales) and the block calls it instead: one
parallel region for the layer, each selected expert's weights read once for
all its tokens, as llama.cpp's mul_mat_id.

The router, the shared experts (an ordinary GatedMLP) and the block's
all-reduce stay in Python. The kernel sums the experts' weighted outputs in
float32 and rounds to BF16 once, where the loop rounds each expert's
weighted output and each addition: the two differ by a few BF16 roundings of
the summands (tests/engine/test_cpu_moe_experts.py bounds it).

The engine installs it (engine/execution/layer_kernels.py) after grid packing,
with one rank only: the kernel holds every expert, and runs no collectives.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from engine.cpu_kernels.library import library
from engine.layers.cpu_grid_weights import GridWeight, grid_weight_of
from engine.layers.cpu_matrix_path import BF16, matrix_path
from engine.layers.moe import SparseMoE

_PTR = ctypes.c_void_p
_TILE = 16


class _Expert(ctypes.Structure):
    _fields_ = [
        ("gate_up_codes", _PTR),
        ("gate_up_scales", _PTR),
        ("down_codes", _PTR),
        ("down_scales", _PTR),
    ]


def _grid(linear: nn.Module) -> GridWeight | None:
    packed = grid_weight_of(linear)
    return packed if isinstance(packed, GridWeight) and packed.bias is None else None


def _kind(weight: GridWeight) -> tuple:
    """What the kernel needs alike in every expert: the layout and the codes' width."""
    return weight.format, weight.bits


def _holds(weight: GridWeight, cols: int) -> bool:
    """Whether the packed codes are a [rows, cols] weight (rows padded to whole tiles)."""
    padded = -(-weight.rows // _TILE) * _TILE
    return weight.codes.numel() == padded * cols * weight.bits // 8


class CpuMoeExperts:
    """One SparseMoE's routed experts, described for `moe_experts`; `run` replaces
    `SparseMoE.run_experts` for the calls `takes` accepts."""

    def __init__(self, gate_up: list[GridWeight], down: list[GridWeight]):
        self._weights = (gate_up, down)  # the array points into their tensors
        self.hidden = down[0].rows
        self.intermediate = gate_up[0].rows // 2
        self.gate_up_format, self.down_format = gate_up[0].format, down[0].format
        refs = [
            _Expert(
                g.codes.data_ptr(), g.scales.data_ptr(), d.codes.data_ptr(), d.scales.data_ptr()
            )
            for g, d in zip(gate_up, down, strict=True)
        ]
        self.experts = (_Expert * len(refs))(*refs)

    @classmethod
    def build(cls, moe: SparseMoE) -> CpuMoeExperts | None:
        """The C form when this rank holds every routed expert, each a bias-free pair of
        grid weights shaped and packed like the first; else None (the loop stays)."""
        if not all(moe.local):
            return None
        gate_up = [_grid(getattr(e, "gate_up_proj", None)) for e in moe.experts]
        down = [_grid(getattr(e, "down_proj", None)) for e in moe.experts]
        if any(w is None for w in gate_up + down):
            return None
        first_gate_up, first_down = gate_up[0], down[0]
        hidden, intermediate = first_down.rows, first_gate_up.rows // 2
        # SwiGLU pairs gate and up columns by 32-wide quantization group (moe_experts.c),
        # and each product's rows are whole blocks of its format (32 values or more).
        if (
            hidden % first_gate_up.format.block
            or intermediate % first_down.format.block
            or first_gate_up.rows != 2 * intermediate
        ):
            return None
        shape = (first_gate_up.rows, _kind(first_gate_up), hidden, _kind(first_down))
        for g, d in zip(gate_up, down, strict=True):
            if (g.rows, _kind(g), d.rows, _kind(d)) != shape:
                return None
            if not (_holds(g, hidden) and _holds(d, intermediate)):
                return None
        return cls(gate_up, down)

    def takes(self, x: torch.Tensor, expert_ids: torch.Tensor) -> bool:
        """BF16 tokens on the CPU, unless the loop would multiply some expert on BF16
        tiles (matrix units, engine/layers/cpu_matrix_path.py): many tokens on one expert."""
        if not (x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.dim() == 2):
            return False
        path, min_rows = matrix_path()
        # An expert takes at most one slot per token, so fewer tokens cannot reach min_rows.
        if path == BF16 and x.shape[0] >= min_rows:
            return int(torch.bincount(expert_ids.reshape(-1)).max()) < min_rows
        return True

    def run(self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """Sum over each token's chosen experts of weight * expert(token): x [T, hidden] BF16,
        weights [T, k] and expert_ids [T, k] from the router."""
        x = x.contiguous()
        out = torch.empty_like(x)
        if x.shape[0] == 0:
            return out
        ids = expert_ids.to(torch.int64).contiguous()
        weights = weights.to(torch.float32).contiguous()
        status = library().moe_experts(
            x.data_ptr(),
            x.shape[0],
            self.hidden,
            self.intermediate,
            ids.data_ptr(),
            weights.data_ptr(),
            ids.shape[1],
            ctypes.addressof(self.experts),
            len(self.experts),
            self.gate_up_format,
            self.down_format,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if status == -1:
            raise MemoryError("moe_experts could not allocate its scratch buffers")
        if status == -2:
            raise ValueError(f"expert ids outside 0..{len(self.experts) - 1}")
        return out


def use_cpu_moe_experts(model: nn.Module) -> int:
    """Give every SparseMoE whose experts the kernel takes its CpuMoeExperts; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.cpu_experts = CpuMoeExperts.build(module)
            count += module.cpu_experts is not None
    return count
