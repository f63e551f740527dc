"""The prefix cache's recurrent-state snapshots without a model: which match a tree with
snapshots gives, what is evicted or dropped first, where chunks stop, and how a page
file carries a state, how many snapshots a budget keeps, and how a state moves between
slots and bytes (engine/kv/prefix_snapshots.py, radix.py, disk_tier.py, state_budget.py,
state_pool.py, engine/core/snapshot_points.py)."""

from __future__ import annotations

import torch

from engine.core.snapshot_points import SnapshotPoints
from engine.kv.disk_tier import PageRecord, decode_page, encode_page, stored_state_bytes
from engine.kv.kv_event_recorder import KVEventRecorder
from engine.kv.kv_events import BlockRemoved, BlockStored
from engine.kv.pages import PageAllocator
from engine.kv.prefix_snapshots import PrefixSnapshots
from engine.kv.radix import RadixCache
from engine.kv.recurrent_state import RecurrentStateLayout
from engine.kv.state_budget import MIN_SNAPSHOTS, plan_state_budget
from engine.kv.state_pool import RecurrentStatePool
from engine.requests.params import SamplingParams
from engine.requests.sequence import Sequence

PAGE = 4


def tree(pages: int = 16, entries: int = 4) -> tuple[RadixCache, PageAllocator, PrefixSnapshots]:
    allocator, snapshots = PageAllocator(pages), PrefixSnapshots(entries)
    return RadixCache(allocator, PAGE, snapshots=snapshots), allocator, snapshots


def cache_prompt(cache, allocator, tokens, snapshot_at: dict[int, int]) -> list:
    """Insert `tokens` as a prefill would, leaving snapshot entry e at token count t for
    each {t: e}; the sequence's own page references are then dropped."""
    pages = allocator.allocate(len(tokens) // PAGE)
    path = []
    for end, entry in sorted(snapshot_at.items()):
        path = cache.insert(tokens[:end], pages, snapshot=entry)
    path = cache.insert(tokens, pages)
    allocator.release(pages)
    return path


def taken(snapshots: PrefixSnapshots, n: int) -> list[int]:
    return [snapshots.take() for _ in range(n)]


def test_a_requests_match_stops_at_the_deepest_snapshot():
    cache, allocator, snapshots = tree()
    tokens = list(range(24))  # six pages
    first, second = taken(snapshots, 2)
    path = cache_prompt(cache, allocator, tokens, {8: first, 16: second})
    hit = cache.match(tokens + [99], "")
    assert hit.num_pages == 4 and hit.snapshot == second and hit.cached_pages == 6
    assert cache.hit_tokens == 16  # the hit rate counts what is reused
    # The tiers and pins see every page, states or not.
    assert cache.match(tokens + [99], "", record=False).num_pages == 6
    assert cache.match(tokens[:9], "").snapshot == first  # two pages usable, one state
    assert cache.match(tokens[:5], "").num_pages == 0
    assert path[1].snapshot == first and path[3].snapshot == second


def test_a_second_snapshot_for_the_same_page_goes_back():
    cache, allocator, snapshots = tree()
    tokens = list(range(8))
    a, b = taken(snapshots, 2)
    pages = allocator.allocate(2)
    cache.insert(tokens, pages, snapshot=a)
    cache.insert(tokens, pages, snapshot=b)
    assert snapshots.num_held == 1 and snapshots.num_free == 3


def test_leaves_without_a_state_are_evicted_first_and_states_leave_with_pages():
    cache, allocator, snapshots = tree(pages=8)
    kept = list(range(8))
    dead = [50 + t for t in range(8)]
    cache_prompt(cache, allocator, kept, {8: snapshots.take()})
    cache_prompt(cache, allocator, dead, {})  # newer, but no state anywhere on it
    assert cache.evict(2) == 2
    assert cache.match(dead + [0], "", record=False).num_pages == 0
    assert cache.match(kept + [0], "").num_pages == 2
    assert cache.evict(2) == 2
    assert snapshots.num_held == 0 and snapshots.num_free == 4


def test_a_pinned_page_giving_way_shows_its_state_to_the_spill_hook_first():
    cache, allocator, snapshots = tree(pages=4)
    tokens = list(range(8))
    entry = snapshots.take()
    path = cache_prompt(cache, allocator, tokens, {8: entry})
    cache.pin(path)
    seen = []
    cache.spill = lambda victims: seen.extend(node.snapshot for node, _ in victims)
    assert cache.evict(2, pinned=True) == 2
    assert seen == [entry, None]  # tail first
    assert path[1].snapshot is None and snapshots.num_free == 4


def test_full_entries_drop_the_least_valuable_snapshot_never_a_locked_one():
    cache, allocator, snapshots = tree(pages=16, entries=3)
    old, new = list(range(12)), [60 + t for t in range(12)]
    old_path = cache_prompt(cache, allocator, old, {4: snapshots.take(), 12: snapshots.take()})
    new_path = cache_prompt(cache, allocator, new, {12: snapshots.take()})
    cache.match(new + [0], "")  # used last
    # The oldest path first, and its shallow (chunk) state before its end.
    entry = snapshots.take()
    assert old_path[0].snapshot is None and old_path[2].snapshot is not None
    snapshots.give_back(entry)
    cache.pin(old_path)  # pinned states go last
    snapshots.lock(snapshots.take())  # the free one, taken and matched this step
    snapshots.lock(new_path[2].snapshot)
    assert snapshots.take() is not None and old_path[2].snapshot is None
    assert snapshots.take() is None  # everything left is locked
    snapshots.unlock_all()
    assert snapshots.dropped == 2


def sequence(n: int) -> Sequence:
    return Sequence("r", list(range(n)), SamplingParams())


def test_chunks_stop_where_a_state_is_worth_keeping():
    _, _, snapshots = tree()
    points = SnapshotPoints(snapshots, PAGE)
    seq = sequence(23)  # the prompt's last usable page boundary: 20
    assert points.cut(seq, 23) == 20
    seq.state_cut = 12  # the tree holds this prompt's pages to 12, without a state
    assert points.cut(seq, 23) == 12 and points.cut(seq, 10) == 10
    seq.num_computed_tokens = 12
    assert points.cut(seq, 11) == 8
    assert points.save_entry(seq, 8) is not None  # ends at 20: kept
    assert points.save_entry(seq, 6) is None  # ends mid-page
    seq.num_computed_tokens = 20
    assert points.save_entry(seq, 3) is None and points.cut(seq, 3) == 3  # the tail


def test_a_page_file_carries_a_state_and_old_files_read_without_one(tmp_path):
    record = PageRecord(b"k" * 16, b"p" * 16, 0, [1, 2], "", b"x" * 10, b"s" * 7)
    data = encode_page(record)
    back = decode_page(data)
    assert (back.payload, back.state) == (b"x" * 10, b"s" * 7)
    (tmp_path / "page").write_bytes(data)
    assert stored_state_bytes(tmp_path / "page") == 7
    plain = encode_page(PageRecord(b"k" * 16, b"p" * 16, 0, [1, 2], "", b"x" * 10))
    assert b"state_bytes" not in plain  # files of models without state are unchanged
    assert decode_page(plain).state == b""


def test_snapshots_take_a_share_of_what_running_states_leave():
    layout = RecurrentStateLayout(
        num_layers=1, num_heads=1, key_dim=8, value_dim=8, conv_channels=8, conv_width=2
    )
    each = layout.bytes_per_sequence(4)  # 256 + 32

    def plan(budget: int, seqs: int = 2, pages: int = 0, on: bool = True):
        return plan_state_budget(layout, torch.float32, seqs, budget, pages, on)

    assert plan(2 * each + 4 * 4 * each).snapshot_entries == MIN_SNAPSHOTS  # above max_num_seqs
    assert plan(2 * each + 4 * 2 * each).snapshot_entries == 2  # a quarter of what is left
    assert plan(2 * each + 4 * 4 * each, pages=15 * each).snapshot_entries == 1  # one sequence
    assert plan(2 * each + 3 * each).snapshot_entries == 0  # no room: prefix caching off
    assert plan(2 * each + 4 * 4 * each, on=False).snapshot_entries == 0
    assert plan(10 * each, seqs=2).reserved_bytes == (2 + 2) * each


def test_kv_events_report_a_hybrid_trees_pages_as_any_others():
    allocator, snapshots = PageAllocator(8), PrefixSnapshots(2)
    recorder = KVEventRecorder(PAGE, int_block_hashes=False)
    cache = RadixCache(allocator, PAGE, events=recorder, snapshots=snapshots)
    tokens = list(range(12))
    cache_prompt(cache, allocator, tokens, {8: snapshots.take()})
    stored = [event for event in recorder.take()[0] if isinstance(event, BlockStored)]
    assert [t for event in stored for t in event.token_ids] == tokens
    cache.evict(8)
    removed = recorder.take()[0]
    assert sorted(h for event in removed for h in event.block_hashes) == sorted(
        h for event in stored for h in event.block_hashes
    )
    assert all(isinstance(event, BlockRemoved) for event in removed)
    assert snapshots.num_free == 2


def test_a_state_moves_between_slots_and_bytes_unchanged():
    layout = RecurrentStateLayout(
        num_layers=2, num_heads=2, key_dim=4, value_dim=4, conv_channels=6, conv_width=3
    )
    running = RecurrentStatePool(layout, 3, torch.bfloat16)
    running.conv.normal_()
    running.recurrent.normal_()
    snapshots = RecurrentStatePool(layout, 2, torch.bfloat16)
    snapshots.copy_from(running, [2], [1])
    assert torch.equal(snapshots.conv[:, 1], running.conv[:, 2])
    assert torch.equal(snapshots.recurrent[:, 1], running.recurrent[:, 2])
    elsewhere = RecurrentStatePool(layout, 1, torch.bfloat16)
    elsewhere.load_slot_bytes(0, snapshots.slot_bytes(1))
    assert elsewhere.slot_bytes(0) == running.slot_bytes(2)
    assert len(running.slot_bytes(0)) == layout.bytes_per_sequence(2)
