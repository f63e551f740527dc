"""What the ranks must agree on before they allocate: checked facts and shared sizes.

Both run over the control group (gloo, CPU objects) while every rank builds
its stack, so a node started with other options fails at start-up with a
message naming the difference, instead of computing wrong steps later.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from engine.collectives import parallel
from engine.errors import EngineError


def check_same_on_all_ranks(facts: dict) -> None:
    """Raise on every rank when any rank's `facts` differ from rank 0's."""
    gathered: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, facts, group=parallel.control_group())
    reference = gathered[0] or {}
    for rank, theirs in enumerate(gathered):
        differ = {
            key: (reference.get(key), (theirs or {}).get(key))
            for key in sorted(reference.keys() | (theirs or {}).keys())
            if reference.get(key) != (theirs or {}).get(key)
        }
        if differ:
            detail = ", ".join(
                f"{k}: rank 0 {a!r}, rank {rank} {b!r}" for k, (a, b) in differ.items()
            )
            raise EngineError(
                f"the ranks were started with different models or options ({detail}); "
                "start every node with the same --model and engine options"
            )


def min_over_ranks(value: int) -> int:
    """The smallest `value` any rank has (e.g. KV pages: page tables are global)."""
    tensor = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=parallel.control_group())
    return int(tensor.item())
