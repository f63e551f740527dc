"""Enumerate the files a person would consider part of the project: not ignored, not .git.

Inside a git work tree, git decides (`ls-files --cached --others
--exclude-standard`): tracked files, plus untracked ones that no ignore rule
covers, from every source git reads. Elsewhere, a directory walk applies the
.gitignore files it meets (tools.ignore). Directory symlinks are listed but
never followed, so a walk cannot loop or leave the tree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import git

from tools.ignore import IgnoreMatcher


def git_toplevel(directory: Path) -> Path | None:
    """The work tree containing `directory`, or None outside git (or inside .git)."""
    if ".git" in directory.parts:
        return None
    try:
        repo = git.Repo(directory, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    try:
        if repo.bare or repo.working_tree_dir is None:
            return None
        return Path(os.path.realpath(repo.working_tree_dir))
    finally:
        repo.close()


def _git_files(directory: Path) -> Iterator[str] | None:
    try:
        raw = git.Git(str(directory)).execute(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            stdout_as_string=False,
        )
    except git.CommandError:  # git failed, or is not installed
        return None
    assert isinstance(raw, bytes)
    names = dict.fromkeys(os.fsdecode(item) for item in raw.split(b"\0") if item)

    def generate() -> Iterator[str]:
        for name in sorted(names):
            # A trailing slash marks a nested repository; tracked files deleted
            # from the work tree are still in the index but not on disk.
            if name.endswith("/") or not os.path.lexists(directory / name):
                continue
            if os.path.isdir(directory / name) and not os.path.islink(directory / name):
                continue  # a submodule
            yield name

    return generate()


def _ancestor_matcher(root: Path, directory: Path) -> IgnoreMatcher:
    """Rules from the .gitignore files of root and every directory down to `directory`."""
    matcher = IgnoreMatcher()
    current = root
    relative_parts = directory.relative_to(root).parts if directory != root else ()
    for depth in range(len(relative_parts) + 1):
        base = "/".join(relative_parts[:depth])
        current = root.joinpath(*relative_parts[:depth])
        gitignore = current / ".gitignore"
        if gitignore.is_file():
            matcher.add_file(gitignore, base)
    return matcher


def _plain_files(root: Path, directory: Path) -> Iterator[str]:
    prefix = directory.relative_to(root).as_posix() if directory != root else ""
    start = len(prefix) + 1 if prefix else 0

    def walk(path: Path, rel: str, matcher: IgnoreMatcher) -> Iterator[str]:
        try:
            entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            child_rel = f"{rel}/{entry.name}" if rel else entry.name
            is_dir = entry.is_dir(follow_symlinks=False)
            if entry.name == ".git" or matcher.matches(child_rel, is_dir):
                continue
            if is_dir:
                child_matcher = matcher.child(Path(entry.path) / ".gitignore", child_rel)
                yield from walk(Path(entry.path), child_rel, child_matcher)
            else:
                yield child_rel[start:]

    yield from walk(directory, prefix, _ancestor_matcher(root, directory))


def visible_files(root: Path, directory: Path) -> Iterator[str]:
    """Non-ignored files under `directory` (inside `root`), as sorted POSIX paths relative
    to `directory`. Ignore files above `root` are not consulted outside git."""
    if git_toplevel(directory) is not None:
        files = _git_files(directory)
        if files is not None:
            return files
    return _plain_files(root, directory)
