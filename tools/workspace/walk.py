"""Enumerate the files a person would consider part of the project: not ignored, not .git.

Inside a git work tree, git decides (`ls-files --cached --others
--exclude-standard`): tracked files, plus untracked ones that no ignore rule
covers, from every source git reads. Elsewhere, a directory walk applies the
.gitignore files it meets (tools.workspace.ignore). Directory symlinks are listed but
never followed, so a walk cannot loop or leave the tree: a name git still
has in its index below a directory that is now a symlink is not listed
(git itself calls it deleted), whereas the link is. Whoever reads a listed
file opens it through safe_fs, which decides where a link may lead.

The user's Resident folders (config, data, cache: tools.workspace.protected) are
left out whole, found by real path, when they lie inside the folder walked
(Resident started in `$HOME`): a search, a listing, the snapshot or a
checkpoint never holds their tokens and journals, which a direct read asks
for. A walk that starts inside one of them lists it: the call that named it
was judged on that path. Whoever follows a listed link checks its target with
`leads_into` (a link may lead into those folders from anywhere).
"""

from __future__ import annotations

import os
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath

from tools.git.env import hardened_git_env
from tools.git.repo import GitError, find_repository
from tools.workspace.ignore import IgnoreMatcher
from tools.workspace.protected import find_state_dirs


def left_out(directory: Path, protected: Iterable[Path] | None = None) -> tuple[Path, ...]:
    """The protected folders (real paths) a walk of `directory` leaves out: `protected`,
    or the user's Resident folders as this process places them when None; all but
    those holding `directory`."""
    if protected is None:
        protected = (state.path for state in find_state_dirs())
    real = Path(os.path.realpath(directory))
    found = {Path(os.path.realpath(path)) for path in protected}
    return tuple(sorted(p for p in found if p != real and p not in real.parents))


def leads_into(real: Path, folders: Iterable[Path]) -> bool:
    """Whether the real path `real` lies in one of `folders` (from `left_out`)."""
    return any(real == folder or folder in real.parents for folder in folders)


def _names_inside(directory: Path, folders: Iterable[Path]) -> tuple[str, ...]:
    """`folders` strictly inside `directory`, as POSIX paths relative to it."""
    real = Path(os.path.realpath(directory))
    return tuple(f.relative_to(real).as_posix() for f in folders if real in f.parents)


def names_left_out(directory: Path, protected: Iterable[Path] | None = None) -> tuple[str, ...]:
    """The folders a walk of `directory` leaves out that lie inside it, relative to it:
    what an outside walker (ripgrep) must be told to skip."""
    return _names_inside(directory, left_out(directory, protected))


def covered(relative: str, names: Iterable[str]) -> bool:
    """Whether `relative` is one of `names` (from `names_left_out`) or lies below one."""
    return any(relative == name or relative.startswith(name + "/") for name in names)


def git_toplevel(directory: Path) -> Path | None:
    """The work tree containing `directory`, or None outside git (or inside .git). Found
    as the git tools find it: a bare-shaped folder never stands in for the repository."""
    if ".git" in directory.parts:
        return None
    try:
        repository = find_repository(directory)
    except GitError:
        return None
    return None if repository is None else repository.work_tree


def _lstat_in_tree(directory: Path) -> Callable[[str], os.stat_result | None]:
    """lstat of a name under `directory`, or None when it is gone or a directory on its
    way is a symlink. Only names are checked here (each directory once); contents are
    read through safe_fs."""
    real_dirs: dict[str, bool] = {"": True}

    def is_real_dir(relative: str) -> bool:
        if relative not in real_dirs:
            ok = is_real_dir(relative.rpartition("/")[0])
            if ok:
                try:
                    ok = stat.S_ISDIR(os.lstat(directory / relative).st_mode)
                except OSError:
                    ok = False
            real_dirs[relative] = ok
        return real_dirs[relative]

    def lstat(name: str) -> os.stat_result | None:
        if not is_real_dir(name.rpartition("/")[0]):
            return None
        try:
            return os.lstat(directory / name)
        except OSError:
            return None

    return lstat


def _git_files(directory: Path, skipped: tuple[str, ...]) -> Iterator[str] | None:
    # subprocess rather than GitPython: GitPython lays `env` over os.environ, which
    # would bring back the GIT_DIR-style variables the hardened environment drops.
    try:
        repository = find_repository(directory)
    except GitError:
        return None
    if repository is None:
        return None
    try:
        completed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=directory,
            env=hardened_git_env(
                os.environ, git_dir=repository.git_dir, work_tree=repository.work_tree
            ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except OSError:  # git is not installed
        return None
    if completed.returncode != 0:
        return None
    names = dict.fromkeys(os.fsdecode(item) for item in completed.stdout.split(b"\0") if item)
    lstat = _lstat_in_tree(directory)

    def generate() -> Iterator[str]:
        for name in sorted(names):
            # A trailing slash marks a nested repository; tracked files deleted
            # from the work tree are still in the index but not on disk.
            if name.endswith("/") or (skipped and covered(name, skipped)):
                continue
            info = lstat(name)
            if info is None or stat.S_ISDIR(info.st_mode):
                continue  # gone, below a symlinked directory, or a submodule
            yield name

    return generate()


def _ancestor_matcher(root: Path, directory: Path) -> IgnoreMatcher:
    """Rules from the .gitignore files of root and every directory down to `directory`."""
    matcher = IgnoreMatcher()
    relative_parts = directory.relative_to(root).parts if directory != root else ()
    for depth in range(len(relative_parts) + 1):
        base = "/".join(relative_parts[:depth])
        matcher.add_file(root, PurePosixPath(base, ".gitignore"), base)
    return matcher


def _plain_files(root: Path, directory: Path, skipped: tuple[str, ...]) -> Iterator[str]:
    prefix = directory.relative_to(root).as_posix() if directory != root else ""
    start = len(prefix) + 1 if prefix else 0
    skipped_dirs = frozenset(skipped)

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
            if is_dir and child_rel[start:] in skipped_dirs:
                continue  # one of the user's Resident folders
            if is_dir:
                child_matcher = matcher.child(
                    root, PurePosixPath(child_rel, ".gitignore"), child_rel
                )
                yield from walk(Path(entry.path), child_rel, child_matcher)
            else:
                yield child_rel[start:]

    yield from walk(directory, prefix, _ancestor_matcher(root, directory))


def visible_files(
    root: Path, directory: Path, protected: Iterable[Path] | None = None
) -> Iterator[str]:
    """Non-ignored files under `directory` (inside `root`), as sorted POSIX paths relative
    to `directory`. Ignore files above `root` are not consulted outside git. The
    protected folders inside `directory` are left out (`left_out`: `protected` by real
    path, or the user's Resident folders as this process places them)."""
    skipped = names_left_out(directory, protected)
    if git_toplevel(directory) is not None:
        files = _git_files(directory, skipped)
        if files is not None:
            return files
    return _plain_files(root, directory, skipped)
