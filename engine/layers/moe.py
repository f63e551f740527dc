"""A mixture-of-experts block: router, routed experts, optional shared experts.

On CPU the block loops over the experts that received at least one token and
runs each on just its tokens (gather with index_select, scatter back with
index_add_). A dense product over all experts would cost E/k times the work:
48x for Kimi K2 (384 experts, 8 per token).

Checkpoint names follow DeepSeek V3 and GLM-4.5: `mlp.gate.weight`,
`mlp.gate.e_score_correction_bias`, `mlp.experts.N.*`, `mlp.shared_experts.*`.
Tensor parallel (docs/DISTRIBUTED.md): the router runs on every rank (the
input is the same everywhere). Routed experts are either split inside (each
rank holds a slice of every expert's intermediate dimension; the default)
or dealt whole to ranks (expert parallel: expert e on rank e % tp). Either
way each rank's output is a partial sum, and the block sums it over the
ranks once, shared experts included.

The router stays in float32 whatever the serving dtype (the model lists it in
`fp32_parameter_suffixes`): expert choice is a ranking of close scores, and
rounding the router to bfloat16 would change which experts run.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from engine.collectives import parallel
from engine.layers.moe_routing import RoutingConfig, route

# Parameter-name suffixes that the loader keeps in float32.
ROUTER_FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")
_EXPERT_INDEX = re.compile(r"\.mlp\.experts\.(\d+)\.")


def is_local_expert(expert: int) -> bool:
    """Whether this rank holds routed expert `expert` (all of them unless expert parallel)."""
    layout = parallel.layout()
    return not layout.expert_parallel or expert % layout.size == layout.rank


def is_local_expert_tensor(name: str) -> bool:
    """False for a checkpoint tensor of a routed expert another rank holds."""
    match = _EXPERT_INDEX.search(name)
    return match is None or is_local_expert(int(match.group(1)))


def _fused_kernel_runs_on(x: torch.Tensor) -> bool:
    """On a GPU, or on CPU tensors under Triton's interpreter (how tests run the GPU path;
    the experts are stacked for it only when a caller asked, see use_fused_kernel)."""
    if x.is_cuda:
        return True
    from engine.gpu_kernels.common import interpreting

    return interpreting()


class TopKRouter(nn.Module):
    def __init__(self, hidden_size: int, routing: RoutingConfig):
        super().__init__()
        self.routing = routing
        self.weight = nn.Parameter(torch.zeros(routing.num_experts, hidden_size))
        if routing.correction_bias:
            self.e_score_correction_bias = nn.Parameter(torch.zeros(routing.num_experts))
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> (weights [T, k] float32, expert ids [T, k])."""
        logits = F.linear(x.float(), self.weight.float())
        bias = self.e_score_correction_bias
        return route(logits, self.routing, None if bias is None else bias.float())


class SparseMoE(nn.Module):
    """Routed experts plus shared experts; each expert maps [n, hidden] -> [n, hidden].

    `make_expert(e)` builds routed expert e; it is called only for the experts
    this rank holds (the others are None in `experts`, and hold no memory).
    Experts and shared experts return partial sums; `forward` all-reduces once."""

    def __init__(
        self,
        hidden_size: int,
        routing: RoutingConfig,
        make_expert,
        shared_experts: nn.Module | None = None,
    ):
        super().__init__()
        self.gate = TopKRouter(hidden_size, routing)
        self.experts = nn.ModuleList(
            make_expert(e) if is_local_expert(e) else nn.Identity()
            for e in range(routing.num_experts)
        )
        self.local = [is_local_expert(e) for e in range(routing.num_experts)]
        self.shared_experts = shared_experts

    fused = None  # the stacked experts for the fused GPU kernel (use_fused_kernel)
    # All routed experts in one C call on CPU (engine/layers/cpu_moe_experts.py), set at load.
    cpu_experts = None
    # The whole layer for decode rows in one C call on CPU (engine/layers/cpu_moe_block.py).
    cpu_block = None

    def use_fused_kernel(self) -> bool:
        """Stack this rank's experts for the fused MoE kernel (GPU); False when they
        cannot be (mixed methods, biases, FP8 slices without a block grid)."""
        from engine.layers.fused_experts import stack_experts

        local = [e for e, here in zip(self.experts, self.local, strict=True) if here]
        self.fused = stack_experts(local) if local else None
        if self.fused is None:
            return False
        # Global expert id -> index in the stack; -1 (another rank's) contributes nothing.
        index = torch.full((len(self.local),), -1, dtype=torch.long)
        index[torch.tensor(self.local)] = torch.arange(len(local))
        self.local_index = index.to(self.gate.weight.device)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_block is not None and self.cpu_block.takes(x):
            return parallel.all_reduce(self.cpu_block.run(x))
        weights, expert_ids = self.gate(x)
        if self.fused is not None and _fused_kernel_runs_on(x):
            from engine.gpu_kernels.fused_moe import fused_moe

            local_ids = self.local_index[expert_ids]
            out = fused_moe(x, local_ids, weights, self.fused)
        elif self.cpu_experts is not None and self.cpu_experts.takes(x, expert_ids):
            out = self.cpu_experts.run(x, weights, expert_ids)
        else:
            out = self.run_experts(x, weights, expert_ids)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return parallel.all_reduce(out)

    def run_experts(
        self, x: torch.Tensor, weights: torch.Tensor, expert_ids: torch.Tensor
    ) -> torch.Tensor:
        """Sum over each token's chosen experts of weight * expert(token), expert by expert."""
        top_k = expert_ids.shape[1]
        flat_ids = expert_ids.reshape(-1)
        # Sorting the (token, slot) pairs by expert makes each expert's tokens
        # one contiguous run; one host sync for the counts instead of one per expert.
        order = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=len(self.experts)).tolist()
        token_rows = order // top_k
        pair_weights = weights.reshape(-1)[order]
        out = torch.zeros_like(x)
        start = 0
        for expert, local, count in zip(self.experts, self.local, counts, strict=True):
            if count == 0 or not local:
                start += count
                continue
            rows = token_rows[start : start + count]
            y = expert(x.index_select(0, rows))
            # Weighting in float32 and rounding once, as the reference does.
            y = (y.float() * pair_weights[start : start + count, None]).to(x.dtype)
            out.index_add_(0, rows, y)
            start += count
        return out
