"""Finding the repository and running git safely for the tools and checkpoints.

Everything goes through argument lists (never a shell), option-looking refs
are refused before git sees them, and paths are confined to the workspace
before they are passed after `--`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import git

from tools.context import ToolContext
from tools.paths import PathError, resolve_path

# Run git as a tool, not as a person at a terminal.
GIT_ENV = {
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_OPTIONAL_LOCKS": "0",
}
_REF_OK = re.compile(r"^[A-Za-z0-9_./@{}~^:+-]+$")


class GitError(Exception):
    """A git problem explained for the model."""


def open_repo(start: Path) -> git.Repo:
    try:
        repo = git.Repo(start, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
        raise GitError(f"{start} is not inside a git repository") from exc
    if repo.bare or repo.working_tree_dir is None:
        repo.close()
        raise GitError("the repository is bare; there is no work tree")
    return repo


def work_tree(repo: git.Repo) -> Path:
    return Path(os.path.realpath(repo.working_tree_dir or "."))


def run_git(
    repo: git.Repo,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input_file=None,
    ok_codes: Sequence[int] = (0,),
) -> bytes:
    """Run git in the work tree and return stdout bytes; GitError (with stderr) on failure."""
    try:
        status, out, err = repo.git.execute(
            ["git", *args],
            with_extended_output=True,
            stdout_as_string=False,
            env={**GIT_ENV, **(env or {})},
            istream=input_file,
            with_exceptions=False,
            strip_newline_in_stdout=False,
        )
    except git.GitCommandNotFound as exc:
        raise GitError("git is not installed") from exc
    if status not in ok_codes:
        message = err.decode("utf-8", "replace") if isinstance(err, bytes) else str(err)
        raise GitError(f"git {args[0]} failed: {message.strip() or f'exit code {status}'}")
    return out if isinstance(out, bytes) else str(out).encode()


def git_text(repo: git.Repo, args: Sequence[str], **kwargs) -> str:
    return run_git(repo, args, **kwargs).decode("utf-8", errors="replace")


def has_commits(repo: git.Repo) -> bool:
    try:
        run_git(repo, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
        return True
    except GitError:
        return False


def verified_ref(repo: git.Repo, ref: str) -> str:
    """The commit id `ref` names; refuses anything git could read as an option."""
    if not ref or ref.startswith("-") or not _REF_OK.match(ref) or ".." in ref.replace("...", ""):
        raise GitError(f"{ref!r} is not a valid revision name")
    try:
        return git_text(repo, ["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"]).strip()
    except GitError as exc:
        raise GitError(f"unknown revision {ref!r}") from exc


def repo_paths(repo: git.Repo, ctx: ToolContext, raw_paths: Sequence[str]) -> list[str]:
    """Workspace-confined paths, relative to the work tree, ready to follow `--`."""
    top = work_tree(repo)
    result = []
    for raw in raw_paths:
        resolved = resolve_path(raw, ctx.allowed_roots)
        try:
            relative = resolved.real.relative_to(top)
        except ValueError as exc:
            raise PathError(f"{raw!r} is not inside the repository at {top}") from exc
        # ':(literal)' stops git from reading glob or magic characters in the name.
        result.append(f":(literal){relative.as_posix() or '.'}")
    return result


def workspace_pathspec(repo: git.Repo, workspace: Path) -> str:
    """The pathspec covering the workspace inside its repository."""
    relative = Path(os.path.realpath(workspace)).relative_to(work_tree(repo)).as_posix()
    return f":(literal){relative}" if relative not in ("", ".") else "."


def cap_text(text: str, limit: int, hint: str) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    note = f"\n… [output truncated at {limit:,} of {len(text):,} chars; {hint}]"
    return text[:limit] + note, True
