"""SlotTables (engine/execution/slot_tables.py): a running sequence's cache slots kept
between steps give exactly the slots of its page table, whatever happened to its pages."""

from __future__ import annotations

import random

import pytest
import torch

from engine.execution.slot_tables import SlotTables

PAGE = 16


def _want(pages: list[int], end: int) -> list[int]:
    return [pages[p // PAGE] * PAGE + p % PAGE for p in range(end)]


def test_a_decoding_sequence_gains_slots_and_pages():
    tables, pages = SlotTables(PAGE), [7]
    for end in range(1, 70):
        if end > len(pages) * PAGE:
            pages.append(100 + end)  # the scheduler's next page
        got = tables.slots("a", pages, end)
        assert got.dtype == torch.long and got.tolist() == _want(pages, end)


def test_changed_pages_rebuild_the_table():
    tables = SlotTables(PAGE)
    assert tables.slots("a", [3, 4, 5], 40).tolist() == _want([3, 4, 5], 40)
    # a rejected draft's page given back and another taken
    assert tables.slots("a", [3, 4, 9], 40).tolist() == _want([3, 4, 9], 40)
    # preempted, then scheduled again on other pages
    assert tables.slots("a", [11], 5).tolist() == _want([11], 5)
    # pages cut to fewer than the table was built from
    assert tables.slots("a", [11, 12, 13], 40).tolist() == _want([11, 12, 13], 40)
    assert tables.slots("a", [11], 3).tolist() == _want([11], 3)


def test_a_key_reused_by_another_sequence_gives_that_sequences_slots():
    tables = SlotTables(PAGE)
    tables.slots("req-1", [1, 2], 20)
    assert tables.slots("req-1", [8, 2], 20).tolist() == _want([8, 2], 20)
    assert tables.slots(None, [5, 6], 17).tolist() == _want([5, 6], 17)  # not kept


def test_random_histories_and_pruning():
    rng, tables = random.Random(0), SlotTables(PAGE)
    pages: dict[str, list[int]] = {}
    for _ in range(400):
        key = f"s{rng.randrange(12)}"
        seq = pages.setdefault(key, [])
        action = rng.random()
        if action < 0.1:
            seq.clear()
        elif action < 0.2 and seq:
            del seq[rng.randrange(len(seq)) :]
        seq.extend(rng.randrange(1000) for _ in range(rng.randrange(3)))
        if seq:
            end = rng.randrange(1, len(seq) * PAGE + 1)
            assert tables.slots(key, seq, end).tolist() == _want(seq, end)
        tables.keep_only({key})
    assert len(tables._tables) <= 2 + 16


def test_positions_past_the_pages_are_refused():
    with pytest.raises(IndexError, match="need 2 pages; the sequence holds 1"):
        SlotTables(PAGE).slots("a", [4], PAGE + 1)
