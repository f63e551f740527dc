"""A hostile repository cannot pull an outside file into the prompt: the snapshot, the map,
AGENTS.md and .residentignore all read through safe_fs, and every skip has a reason."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agent.core.clients import estimate_tokens
from agent.core.context import select_files, take_snapshot
from agent.core.context.agents_md import agents_instructions, read_agents_files
from agent.core.context.selection import OUTSIDE_LINK, PROTECTED_LINK
from tests.agent.conftest import git

SECRET = "aws_secret_access_key = TOPSECRET"


@pytest.fixture
def outside(tmp_path) -> Path:
    path = Path(os.path.realpath(tmp_path / "home"))
    (path / ".aws").mkdir(parents=True)
    (path / ".aws" / "credentials").write_text(f"[default]\n{SECRET}\n")
    (path / "etc").mkdir()
    (path / "etc" / "passwd.md").write_text(f"{SECRET}\n")
    return path


def plant(repo: Path, outside: Path) -> None:
    """Links out of every shape, one link inside, and a FIFO named like a document."""
    (repo / "notes.md").symlink_to(outside / ".aws" / "credentials")
    (repo / "docs").symlink_to(outside / "etc", target_is_directory=True)
    (repo / "chain.md").symlink_to("chain2.md")
    (repo / "chain2.md").symlink_to(os.path.relpath(outside / "etc" / "passwd.md", repo))
    (repo / "readme-link.md").symlink_to("README.md")  # stays inside, target is a candidate
    (repo / "vendor").mkdir()
    (repo / "vendor" / "guide.md").write_text("the vendored guide\n")
    (repo / "guide.md").symlink_to("vendor/guide.md")  # stays inside, target excluded


def no_hang(function, seconds: float = 10.0):
    result: list = []
    thread = threading.Thread(target=lambda: result.append(function()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked (a FIFO opened for reading?)"
    return result[0]


@pytest.mark.parametrize("tracked", [False, True])
def test_selection_never_reads_through_a_link_out(repo, outside, tracked):
    plant(repo, outside)
    if tracked:
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "hostile")
    files, omitted = select_files(repo)
    assert all(SECRET not in f.text and "TOPSECRET" not in f.text for f in files)
    reasons = {o.path: o.reason for o in omitted}
    for link in ("notes.md", "docs", "chain.md", "chain2.md"):
        assert reasons[link] == OUTSIDE_LINK, link
    assert reasons["readme-link.md"] == "symbolic link to README.md"  # no duplicate
    shown = {f.path: f.text for f in files}
    assert shown["guide.md"] == "the vendored guide\n"  # a link inside reads its target
    assert "vendor/guide.md" not in shown  # the target itself is excluded by rule


def test_a_fifo_named_like_a_document_does_not_hang_the_snapshot(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    os.mkfifo(tmp_path / "notes.md")
    files, omitted = no_hang(lambda: select_files(tmp_path))
    assert [f.path for f in files] == ["a.py"]
    assert {o.path: o.reason for o in omitted}["notes.md"] == "not a regular file"


def test_full_snapshot_and_map_leave_the_secret_out(repo, outside):
    plant(repo, outside)
    full = take_snapshot(repo, 1, 100_000, estimate_tokens)
    assert full.mode == "full" and "TOPSECRET" not in full.text
    big = "\n".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(400))
    (repo / "big.py").write_text(big)
    repo_map = take_snapshot(repo, 1, 1500, estimate_tokens, task="read notes.md and docs")
    assert repo_map.mode == "map" and "TOPSECRET" not in repo_map.text
    assert ("notes.md", OUTSIDE_LINK) in [(o.path, o.reason) for o in repo_map.omitted]


def test_agents_md_linking_out_is_skipped_and_reported(repo, outside):
    (repo / "AGENTS.md").symlink_to(outside / ".aws" / "credentials")
    (repo / "sub").mkdir()
    (repo / "sub" / "CLAUDE.md").write_text("Use tabs here.\n")
    (repo / "sub" / "AGENTS.md").symlink_to("CLAUDE.md")  # the common alias, inside
    git(repo, "add", "-A")
    found = read_agents_files(repo)
    assert found.skipped == [("AGENTS.md", "symbolic link leading outside the workspace")]
    assert found.texts == [("sub/AGENTS.md", "Use tabs here.")]
    instructions = agents_instructions(repo)
    assert "TOPSECRET" not in instructions and "Use tabs here." in instructions


def test_agents_md_fifo_does_not_hang(tmp_path):
    os.mkfifo(tmp_path / "AGENTS.md")
    found = no_hang(lambda: read_agents_files(tmp_path))
    assert found.texts == [] and [path for path, _ in found.skipped] == ["AGENTS.md"]


def test_residentignore_is_never_read_through_a_link(tmp_path, outside):
    (outside / "rules").write_text("*.py\n")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "a.py").write_text("x = 1\n")
    (workspace / ".residentignore").symlink_to(outside / "rules")
    files, omitted = select_files(workspace)
    assert [f.path for f in files] == ["a.py"]  # the outside rules were not applied
    assert (".residentignore", OUTSIDE_LINK) in [(o.path, o.reason) for o in omitted]


def test_an_index_entry_below_a_directory_swapped_for_a_link(repo, outside):
    """`docs/passwd.md` is tracked; then `docs` becomes a link out. Git still lists the
    entry, the snapshot must not read it through the link."""
    (repo / "docs").mkdir()
    (repo / "docs" / "passwd.md").write_text("harmless\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "docs")
    (repo / "docs" / "passwd.md").unlink()
    (repo / "docs").rmdir()
    (repo / "docs").symlink_to(outside / "etc", target_is_directory=True)
    snapshot = take_snapshot(repo, 1, 100_000, estimate_tokens)
    assert "TOPSECRET" not in snapshot.text
    assert "docs/passwd.md" not in [f.path for f in snapshot.all_files]
    assert ("docs", OUTSIDE_LINK) in [(o.path, o.reason) for o in snapshot.omitted]


@pytest.mark.parametrize("tracked", [False, True])
def test_residents_folders_in_a_home_workspace_stay_out_of_the_prompt(repo, monkeypatch, tracked):
    """Resident started in $HOME (a dotfiles repository, say): the snapshot and AGENTS.md
    leave the user's config, data and cache folders out, as this process places them,
    and every link leading there; nothing passes `protected` here."""
    monkeypatch.setenv("HOME", str(repo))
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "RESIDENT_CONFIG_DIR",
                 "RESIDENT_DATA_DIR", "RESIDENT_CACHE_DIR"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    folders = {".config/resident": "mcp.json", ".local/share/resident": "journal.md",
               ".cache/resident": "kernel.md"}  # fmt: skip
    for folder, name in folders.items():
        (repo / folder).mkdir(parents=True)
        (repo / folder / name).write_text(f"{SECRET} in {folder}\n")
    (repo / "servers.md").symlink_to(".config/resident/mcp.json")
    (repo / "AGENTS.md").symlink_to(".local/share/resident/journal.md")
    if tracked:
        git(repo, "add", "-A")
    files, omitted = select_files(repo)
    assert "README.md" in [f.path for f in files]
    assert not [f.path for f in files if "resident" in f.path or "TOPSECRET" in f.text]
    reasons = {o.path: o.reason for o in omitted}
    assert reasons["servers.md"] == reasons["AGENTS.md"] == PROTECTED_LINK
    assert not [path for path in reasons if path.startswith((".config", ".local", ".cache"))]
    assert "TOPSECRET" not in take_snapshot(repo, 1, 100_000, estimate_tokens).text
    found = read_agents_files(repo)
    assert found.texts == [] and [path for path, _ in found.skipped] == ["AGENTS.md"]
    assert "TOPSECRET" not in agents_instructions(repo)
