"""Each running sequence's cache slots, kept from one step to the next.

A sequence's context slots are a pure function of its page table: position p sits at
slot pages[p // page_size] * page_size + p % page_size. The runner used to rebuild the
whole context's slots every step (five tensor operations over every position), though
a decoding sequence gains one position a step and a page every page_size steps. After
a decode step has streamed the model's weights through the caches each of those small
operations runs cold: ~0.1 ms a sequence a step, 1% of a 1.9B MoE model's step on
two cores.

Here a sequence's table is kept with the page list it was built from and reused while
that list is still a prefix of the sequence's pages; new pages are appended, and any
other change (pages given back on preemption, a rejected draft's pages released and
others taken) rebuilds it. A table is only ever looked up through its pages, so a
stale or reused key can never give wrong slots.
"""

from __future__ import annotations

import torch


class SlotTables:
    def __init__(self, page_size: int):
        self.page_size = page_size
        self._tables: dict[object, tuple[list[int], torch.Tensor]] = {}

    def page_slots(self, pages: list[int]) -> torch.Tensor:
        """Every slot of these pages, in position order."""
        table = torch.tensor(pages, dtype=torch.long)[:, None] * self.page_size
        return (table + torch.arange(self.page_size)).flatten()

    def slots(self, key: object, pages: list[int], end: int) -> torch.Tensor:
        """Slots of positions [0, end) of the sequence `key` with these pages (key None:
        not kept)."""
        needed = -(-end // self.page_size)
        if needed > len(pages):
            raise IndexError(
                f"{end} positions need {needed} pages; the sequence holds {len(pages)}"
            )
        if key is None:
            return self.page_slots(pages[:needed])[:end]
        entry = self._tables.get(key)
        if entry is not None and pages[: len(entry[0])] == entry[0]:
            known, table = entry
            if len(known) < needed:
                table = torch.cat((table, self.page_slots(pages[len(known) : needed])))
                self._tables[key] = (pages[:needed], table)
        else:
            table = self.page_slots(pages[:needed])
            self._tables[key] = (pages[:needed], table)
        return table[:end]

    def keep_only(self, keys: set[object]) -> None:
        """Forget the tables of sequences no longer running, once there are many."""
        if len(self._tables) > 2 * len(keys) + 16:
            self._tables = {k: v for k, v in self._tables.items() if k in keys}
