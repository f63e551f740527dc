"""A new epoch keeps the previous block and appends an update section (context/update.py)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from agent.core.clients import estimate_tokens
from agent.core.context import ContextSettings, ResidentContext, take_snapshot

UPDATE = "<repository_update>\n"


class CountingClient:
    """What ResidentContext asks of a client: the window and a token count."""

    async def context_window(self) -> int:
        return 100_000

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)


def make_files(root: Path, sizes: dict[str, int]) -> None:
    """Outside git the first order is by path: a.py leads, the worst place for an edit."""
    for name, lines in sizes.items():
        (root / name).write_text("".join(f"{name[0]}_{n} = {n}\n" for n in range(lines)))


def context(root: Path, **settings: float) -> ResidentContext:
    resident = ResidentContext(root, CountingClient(), [], settings=ContextSettings(**settings))
    asyncio.run(resident.start())
    return resident


def update_of(text: str) -> str:
    return text[text.index(UPDATE) :]


def file_blocks(text: str) -> dict[str, str]:
    """path -> content of every `<file>` in `text` (the last copy wins)."""
    found = re.findall(r'<file path="([^"]+)"[^>]*>\n(.*?)</file>\n', text, re.S)
    return dict(found)


def test_the_next_epoch_extends_the_previous_system_message(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 40, "c.py": 40, "d.py": 40})
    resident = context(tmp_path)
    before = resident.system_message()["content"]
    (tmp_path / "a.py").write_text("a = 'edited'\n")
    snapshot = resident.new_epoch()
    after = resident.system_message()["content"]
    assert after.startswith(before) and after[len(before) :].startswith(UPDATE)
    assert before.endswith("</repository>\n")  # the block ends the message
    update = update_of(after)
    assert file_blocks(update) == {"a.py": "a = 'edited'\n"}
    assert update.endswith('<snapshot epoch="2" files="4"/>\n</repository_update>\n')
    assert [f.path for f in snapshot.files] == ["b.py", "c.py", "d.py", "a.py"]
    assert snapshot.stamp_of("a.py").text == "a = 'edited'\n"
    assert snapshot.tokens == estimate_tokens(snapshot.text)


def test_the_update_holds_exactly_the_changed_added_and_removed_files(tmp_path):
    make_files(tmp_path, {"a.py": 400, "b.py": 40, "c.py": 40, "d.py": 40})
    first = take_snapshot(tmp_path, 1, 10_000, estimate_tokens)
    old_b = first.stamp_of("b.py").short_hash
    (tmp_path / "b.py").write_text("b = 'changed'\n")
    (tmp_path / "c.py").unlink()
    (tmp_path / "e.py").write_text("e = 'added'\n")
    (tmp_path / "d.py").touch()  # a new mtime, the same bytes: no update
    second = take_snapshot(tmp_path, 2, 10_000, estimate_tokens, previous=first)
    assert second.text.startswith(first.text)
    update = update_of(second.text)
    assert file_blocks(update) == {"b.py": "b = 'changed'\n", "e.py": "e = 'added'\n"}
    new_b, e = second.stamp_of("b.py").short_hash, second.stamp_of("e.py").short_hash
    assert f'<file path="b.py" sha256="{new_b}" replaces="{old_b}">\n' in update
    assert f'<file path="e.py" sha256="{e}" added="true">\n' in update
    assert re.findall(r'<removed path="([^"]+)"/>', update) == ["c.py"]
    assert [f.path for f in second.all_files] == ["a.py", "b.py", "d.py", "e.py"]
    assert second.superseded_bytes == first.stamp_of("b.py").size + first.stamp_of("c.py").size
    # What the model reads as current, last copy of each path, is the working tree.
    current = {p: t for p, t in file_blocks(second.text).items() if p != "c.py"}
    assert current == {f.path: f.text for f in second.files}


def test_a_second_edit_of_the_same_file_appends_another_section(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 40, "c.py": 40, "d.py": 40})
    resident = context(tmp_path)
    sizes = [resident.snapshot.stamp_of("a.py").size]
    (tmp_path / "a.py").write_text("a = 2\n")
    second = resident.new_epoch()
    sizes.append(second.stamp_of("a.py").size)
    (tmp_path / "a.py").write_text("a = 3\n")
    third = resident.new_epoch()
    assert third.text.startswith(second.text)
    last = third.text[len(second.text) :]
    assert last.startswith(UPDATE) and file_blocks(last) == {"a.py": "a = 3\n"}
    assert f'replaces="{second.stamp_of("a.py").short_hash}"' in last
    assert file_blocks(third.text)["a.py"] == "a = 3\n"  # the last copy is current
    assert third.superseded_bytes == sum(sizes)


def test_staleness_reads_the_version_in_the_update(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 40, "c.py": 40, "d.py": 40})
    resident = context(tmp_path)
    (tmp_path / "a.py").write_text("a = 'edited'\n")
    assert resident.stale_paths() == ["a.py"]
    resident.new_epoch()
    assert resident.stale_paths() == [] and not resident.needs_new_epoch()
    (tmp_path / "a.py").write_text("a = 'edited again, and now a longer file'\n")
    assert resident.stale_paths() == ["a.py"]
    # a.py's current version is small: its change is no reason for a new epoch.
    assert not resident.needs_new_epoch()
    (tmp_path / "b.py").write_text("b = 'edited'\n")
    assert resident.needs_new_epoch()  # b.py: a third of the current bytes


def test_an_epoch_without_changes_keeps_the_text_whole(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 40})
    resident = context(tmp_path)
    before = resident.snapshot
    after = resident.new_epoch()  # a compaction or a new tool list
    assert after.text == before.text and after.tokens == before.tokens
    assert after.epoch == 2


def test_changes_at_the_tail_render_the_block_again(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 400, "c.py": 40})
    first = take_snapshot(tmp_path, 1, 10_000, estimate_tokens)
    (tmp_path / "c.py").write_text("c = 'edited'\n")  # the last file in the block
    (tmp_path / "d.py").write_text("d = 'added'\n")
    second = take_snapshot(tmp_path, 2, 10_000, estimate_tokens, previous=first)
    # The same prefix an update would keep, and no superseded copy of c.py.
    assert UPDATE not in second.text and second.superseded_bytes == 0
    assert second.text.startswith(first.text[: first.text.index('<file path="c.py"')])
    assert [f.path for f in second.files] == ["a.py", "b.py", "c.py", "d.py"]
    # Once the block holds an update, later changes are appended wherever they sit.
    (tmp_path / "a.py").write_text("a = 'edited'\n")
    third = take_snapshot(tmp_path, 3, 10_000, estimate_tokens, previous=second)
    (tmp_path / "d.py").write_text("d = 'edited'\n")
    fourth = take_snapshot(tmp_path, 4, 10_000, estimate_tokens, previous=third)
    assert fourth.text.startswith(third.text) and UPDATE in third.text
    assert file_blocks(fourth.text[len(third.text) :]) == {"d.py": "d = 'edited'\n"}
    assert fourth.updates == 2


def test_superseded_copies_past_the_bound_render_the_block_again(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 40, "c.py": 40, "d.py": 40})
    resident = context(tmp_path, superseded_fraction=0.4)
    first = resident.snapshot
    (tmp_path / "a.py").write_text("a = 'edited'\n")
    second = resident.new_epoch()  # a third of the current bytes superseded: kept
    assert UPDATE in second.text
    (tmp_path / "b.py").write_text("b = 'edited'\n")
    third = resident.new_epoch()  # as many as are current: rendered again, stable order
    assert UPDATE not in third.text and third.superseded_bytes == 0
    assert [f.path for f in third.files] == ["c.py", "d.py", "a.py", "b.py"]
    assert third.text.startswith(first.text[: first.text.index('<file path="a.py"')])
    assert file_blocks(third.text) == {f.path: f.text for f in third.files}


def test_a_kept_block_over_the_budget_is_rendered_again(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 400})
    first = take_snapshot(tmp_path, 1, 10_000, estimate_tokens)
    (tmp_path / "a.py").write_text("a = 'edited'\n")
    kept = take_snapshot(tmp_path, 2, 10_000, estimate_tokens, previous=first)
    assert UPDATE in kept.text  # within the superseded bound
    budget = first.tokens + 10  # the new block fits, the old one with an update does not
    second = take_snapshot(tmp_path, 2, budget, estimate_tokens, previous=first)
    assert second.mode == "full" and UPDATE not in second.text
    assert second.tokens <= budget


def test_a_changed_system_prompt_renders_the_block_again(tmp_path):
    make_files(tmp_path, {"a.py": 40, "b.py": 40})
    resident = context(tmp_path)
    (tmp_path / "AGENTS.md").write_text("Run the tests.\n")  # nothing cached to keep
    snapshot = resident.new_epoch()
    assert UPDATE not in snapshot.text and "Run the tests." in resident.system_prompt


def test_a_map_is_taken_as_before(tmp_path):
    make_files(tmp_path, {"a.py": 400, "b.py": 400, "c.py": 10})
    budget = 1200
    first = take_snapshot(tmp_path, 1, budget, estimate_tokens, task="c.py")
    assert first.mode == "map"
    (tmp_path / "c.py").write_text("c = 'edited'\n")
    second = take_snapshot(tmp_path, 2, budget, estimate_tokens, task="c.py", previous=first)
    assert second.mode == "map" and UPDATE not in second.text
    assert second.stamp_of("c.py").text == "c = 'edited'\n"
