"""Which recurrent-state slot each running sequence holds: integers only, like the page allocator.

A hybrid model's state pool (engine/kv/state_pool.py) has one slot per
sequence that may run at once (max_num_seqs). The scheduler takes a slot when
it admits a sequence and gives it back when the sequence finishes or is
preempted, together with its pages; the runner zeroes a slot whenever its
sequence starts from its first token, so a reused slot never leaks another
sequence's state.
"""

from __future__ import annotations


class StateSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int:
        if not self._free:
            # The scheduler admits at most max_num_seqs sequences, one slot each.
            raise RuntimeError(f"all {self.num_slots} recurrent-state slots are held")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise RuntimeError(f"recurrent-state slot {slot} released twice or never held")
        self._free.append(slot)
