"""The snapshot's file order: stable files lead, and a block rendered again keeps its prefix.

A new epoch usually keeps the previous text and appends an update
(test_epoch_update.py); these tests render the block again
(`max_superseded=None`), as past the superseded-copy bound."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agent.core.clients import estimate_tokens
from agent.core.context import take_snapshot
from agent.core.context.ordering import change_times


def commit(repo: Path, when: int, *names: str) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_DATE": f"{when} +0000",
        "GIT_COMMITTER_DATE": f"{when} +0000",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    for name in names:
        subprocess.run(["git", "add", name], cwd=repo, check=True, env=env)
    subprocess.run(["git", "commit", "-q", "-m", f"at {when}"], cwd=repo, check=True, env=env)


def make_repo(tmp_path: Path) -> Path:
    """Five files committed at different times: e (oldest) ... a (newest)."""
    repo = Path(os.path.realpath(tmp_path / "repo"))
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for when, name in enumerate(["e.py", "d.py", "c.py", "b.py", "a.py"], start=1_700_000_000):
        (repo / name).write_text(f"# {name}\nvalue = {when}\n")
        commit(repo, when, name)
    return repo


def order(snapshot) -> list[str]:
    return [f.path for f in snapshot.files]


def test_the_first_snapshot_puts_what_changed_recently_last(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "d.py").write_text("# d.py, edited and not committed\n")
    (repo / "new.py").write_text("# untracked\n")
    first = take_snapshot(repo, 1, 10_000, estimate_tokens)
    assert order(first) == ["e.py", "c.py", "b.py", "a.py", "d.py", "new.py"]
    # The same state renders the same text: two sessions share the cache.
    assert take_snapshot(repo, 1, 10_000, estimate_tokens).text == first.text


def test_a_block_rendered_again_keeps_unchanged_files_in_place(tmp_path):
    repo = make_repo(tmp_path)
    first = take_snapshot(repo, 1, 10_000, estimate_tokens)
    assert order(first) == ["e.py", "d.py", "c.py", "b.py", "a.py"]
    (repo / "d.py").write_text("# d.py edited\n")
    (repo / "b.py").unlink()
    (repo / "added.py").write_text("# added\n")
    second = take_snapshot(repo, 2, 10_000, estimate_tokens, previous=first, max_superseded=None)
    assert order(second) == ["e.py", "c.py", "a.py", "added.py", "d.py"]
    # Everything before the first changed file is the same text, epoch number included.
    unchanged = first.text[: first.text.index('<file path="d.py"')]
    assert second.text.startswith(unchanged)
    assert '<snapshot epoch="2" files="5"/>' in second.text


def test_an_edit_at_the_tail_keeps_the_whole_rest_of_the_snapshot(tmp_path):
    repo = make_repo(tmp_path)
    first = take_snapshot(repo, 1, 10_000, estimate_tokens)
    (repo / "a.py").write_text("# a.py, the newest file, edited again\n")
    second = take_snapshot(repo, 2, 10_000, estimate_tokens, previous=first, max_superseded=None)
    before_a = first.text[: first.text.index('<file path="a.py"')]
    assert second.text.startswith(before_a)
    assert before_a.count("<file ") == 4  # all the other files stay cached
    third = take_snapshot(repo, 3, 10_000, estimate_tokens, previous=second, max_superseded=None)
    assert third.text.split("<snapshot ")[0] == second.text.split("<snapshot ")[0]


def test_outside_git_the_order_is_by_path(tmp_path):
    for name in ("b.py", "a.py", "c.py"):
        (tmp_path / name).write_text(f"# {name}\n")
    assert change_times(tmp_path) == {}
    assert order(take_snapshot(tmp_path, 1, 10_000, estimate_tokens)) == ["a.py", "b.py", "c.py"]


def test_a_workspace_below_the_top_level_reads_its_own_paths(tmp_path):
    repo = make_repo(tmp_path)
    (repo / "pkg").mkdir()
    (repo / "pkg" / "old.py").write_text("# old\n")
    commit(repo, 1_600_000_000, "pkg/old.py")  # an older commit date, made later
    (repo / "pkg" / "new.py").write_text("# new\n")
    commit(repo, 1_800_000_000, "pkg/new.py")
    times = change_times(repo / "pkg")
    assert times == {"old.py": 1_600_000_000.0, "new.py": 1_800_000_000.0}
