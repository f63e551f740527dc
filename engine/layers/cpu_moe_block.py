"""A MoE layer's decode rows on CPU in one C call (engine/cpu_kernels/moe_block.c).

`SparseMoE.forward` at one decode row is a dozen torch calls for the router and
the routing, the routed experts' C call (engine/layers/cpu_moe_experts.py),
three module calls for the shared expert and the sum: the Python and torch's
dispatch between them cost more than the experts' products at a Kimi or GLM
shape. `CpuMoEBlock` describes the whole layer to C once (router weights and
routing, the experts, the shared expert's grid weights) and takes the rows
SparseMoE hands it when they are few (decode steps); prefill keeps the module
path, where the per-call costs are spread over many rows and the routed
experts may run on BF16 tiles.

What it computes is the module path's, step for step (moe_block.c says where
the arithmetic may differ: the router's float32 sums are in another order).
The engine installs it with one rank only (engine/execution/layer_kernels.py),
after CpuMoeExperts.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from engine.cpu_kernels.grid_matmul import GridWeightRef
from engine.cpu_kernels.library import library
from engine.layers.cpu_grid_weights import GridWeight, grid_weight_of
from engine.layers.cpu_matrix_path import BF16, matrix_path
from engine.layers.moe import SparseMoE
from engine.layers.moe_routing import RoutingConfig

_I64, _FLOAT, _PTR = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
# Rows beyond this are prefill: the module path spreads its per-call costs over them.
MAX_ROWS = 32
_SCORING = {"sigmoid": 0, "softmax": 1}
_RANKING = {"none": 0, "top2_sum": 1, "max": 2}


class _Routing(ctypes.Structure):
    """moe_block.c's MoeRouting."""

    _fields_ = [
        *((name, _I64) for name in ("experts", "top_k", "groups", "top_groups")),
        *((name, _I64) for name in ("scoring", "ranking", "normalize")),
        ("scaling", _FLOAT),
        ("router", _PTR),
        ("bias", _PTR),
    ]


def _routing(config: RoutingConfig, router: torch.Tensor, bias: torch.Tensor | None) -> _Routing:
    ranking = config.group_ranking if config.grouped else "none"
    return _Routing(
        experts=config.num_experts,
        top_k=config.top_k,
        groups=config.num_groups,
        top_groups=config.top_groups,
        scoring=_SCORING[config.scoring],
        ranking=_RANKING[ranking],
        normalize=int(config.normalize),
        scaling=config.scaling,
        router=router.data_ptr(),
        bias=None if bias is None else bias.data_ptr(),
    )


def _grid(linear: nn.Module | None) -> GridWeight | None:
    packed = grid_weight_of(linear) if linear is not None else None
    return packed if isinstance(packed, GridWeight) else None


class CpuMoEBlock:
    """One SparseMoE described for `moe_block`; `run` replaces its forward for few rows."""

    def __init__(self, moe: SparseMoE, shared: tuple[GridWeight, GridWeight] | None):
        gate = moe.gate
        # float32 copies are the tensors the module reads as .float(): the same values
        self._router = gate.weight.detach().float().contiguous()
        bias = gate.e_score_correction_bias
        self._bias = None if bias is None else bias.detach().float().contiguous()
        self.routing = _routing(gate.routing, self._router, self._bias)
        self.experts = moe.cpu_experts
        self._shared = shared  # the references below point into these weights' tensors
        # GridWeightRefs of the shared expert's weights (None: no shared expert)
        if shared is None:
            self.shared_gate_up = self.shared_down = None
            self.shared_intermediate = 0
        else:
            self.shared_gate_up, self.shared_down = (GridWeightRef.of(w) for w in shared)
            self.shared_intermediate = shared[0].rows // 2

    @classmethod
    def build(cls, moe: SparseMoE) -> CpuMoEBlock | None:
        """The C form when the routed experts run in C (CpuMoeExperts), the routing is
        one the kernel implements, and the shared expert, if any, is a pair of grid
        weights; else None."""
        if moe.cpu_experts is None:
            return None
        routing = moe.gate.routing
        if routing.scoring not in _SCORING or routing.group_ranking not in _RANKING:
            return None
        shared = moe.shared_experts
        pair = None
        if shared is not None:
            gate_up, down = (getattr(shared, name, None) for name in ("gate_up_proj", "down_proj"))
            pair = (_grid(gate_up), _grid(down))
            hidden = moe.cpu_experts.hidden
            if (
                any(w is None for w in pair)
                or gate_up.in_features != hidden
                or pair[1].rows != hidden
                or pair[0].rows != 2 * down.in_features
            ):
                return None
        return cls(moe, pair)

    def takes(self, x: torch.Tensor) -> bool:
        """A few BF16 rows on the CPU, unless the module path would run the experts on
        BF16 tiles (matrix units) for them."""
        if not (
            x.dtype == torch.bfloat16
            and x.device.type == "cpu"
            and x.dim() == 2
            and 0 < x.shape[0] <= MAX_ROWS
        ):
            return False
        path, min_rows = matrix_path()
        return not (path == BF16 and x.shape[0] >= min_rows)

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """The layer's output [T, hidden] BF16 for rows x [T, hidden] (before any reduce)."""
        x = x.contiguous()
        out = torch.empty_like(x)
        experts = self.experts
        shared = self.shared_gate_up is not None
        status = library().moe_block(
            ctypes.addressof(self.routing),
            x.data_ptr(),
            x.shape[0],
            experts.hidden,
            experts.intermediate,
            ctypes.addressof(experts.experts),
            experts.gate_up_format,
            experts.down_format,
            ctypes.addressof(self.shared_gate_up) if shared else None,
            ctypes.addressof(self.shared_down) if shared else None,
            self.shared_intermediate,
            out.data_ptr(),
            torch.get_num_threads(),
        )
        if status == -1:
            raise MemoryError("moe_block could not allocate its scratch buffers")
        if status != 0:
            raise ValueError("moe_block: a shape or format its products do not take")
        return out

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's routing alone: (weights [T, k] float32, expert ids [T, k]) for rows x
        [T, hidden] BF16, as the router module returns them (for tests)."""
        x = x.contiguous()
        rows, k = x.shape[0], self.routing.top_k
        ids = torch.empty(rows, k, dtype=torch.int64)
        weights = torch.empty(rows, k, dtype=torch.float32)
        status = library().moe_route(
            ctypes.addressof(self.routing), x.data_ptr(), rows, x.shape[1], ids.data_ptr(),
            weights.data_ptr(), torch.get_num_threads(),
        )  # fmt: skip
        if status != 0:
            raise MemoryError("moe_route could not allocate its scratch buffers")
        return weights, ids


def use_cpu_moe_blocks(model: nn.Module) -> int:
    """Give every SparseMoE whose layer the kernel takes its CpuMoEBlock; returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, SparseMoE):
            module.cpu_block = CpuMoEBlock.build(module)
            count += module.cpu_block is not None
    return count
