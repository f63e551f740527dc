"""How a hybrid model's recurrent states share the KV budget with its pages.

Two pools of states come out of the budget before the pages take the rest
(engine/kv/pool_budget.py `reserved_bytes`):

- one slot per sequence that may run (max_num_seqs), as before;
- with prefix caching, the prefix cache's snapshots (engine/kv/prefix_snapshots.py):
  up to as many again (at least MIN_SNAPSHOTS, so an engine that runs one sequence
  keeps a pinned prefix's state beside the newest prompts'), within SNAPSHOT_SHARE
  of what the running slots leave, and
  never so many that the pages could not hold one sequence of max_model_len (a
  budget that holds the running states and one sequence still starts, with fewer
  snapshots or none, which turns prefix caching off).

A snapshot costs a whole state: for Kimi Linear about as much as a few thousand
tokens of its MLA pages, so they are few, and taken only where a prefix ends
(engine/core/snapshot_points.py). The planner counts
`(running_slots + snapshot_entries) * bytes_each` for these models.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kv.recurrent_state import RecurrentStateLayout

# Of the budget the running states leave, the most the prefix cache's snapshots take.
SNAPSHOT_SHARE = 0.25
MIN_SNAPSHOTS = 4


@dataclass(frozen=True)
class StateBudget:
    running_slots: int
    snapshot_entries: int
    bytes_each: int  # one sequence's state over all its linear-attention layers

    @property
    def reserved_bytes(self) -> int:
        return (self.running_slots + self.snapshot_entries) * self.bytes_each


def plan_state_budget(
    layout: RecurrentStateLayout,
    conv_dtype: torch.dtype,
    max_num_seqs: int,
    budget_bytes: int,
    min_page_bytes: int,
    prefix_caching: bool,
) -> StateBudget:
    """The states this budget keeps; `min_page_bytes` is what one sequence of
    max_model_len needs in pages (left to the pages whatever happens)."""
    each = layout.bytes_per_sequence(conv_dtype.itemsize)
    snapshots = 0
    if prefix_caching:
        left = budget_bytes - max_num_seqs * each
        room = min(int(left * SNAPSHOT_SHARE), left - min_page_bytes)
        snapshots = max(0, min(max(max_num_seqs, MIN_SNAPSHOTS), room // each))
    return StateBudget(max_num_seqs, snapshots, each)
