"""Finding the repository and running git safely for the tools and checkpoints.

The repository is found here, not by git and not by GitPython: both treat a
directory holding `HEAD`, `objects/` and `refs/` as a (bare) repository, so
a folder of that shape shipped inside a project would become "the
repository", and its `config` (core.fsmonitor, hooks...) would run programs.
Only a `.git` directory or a `.git` file naming a gitdir (worktrees,
submodules) counts, the way `safe.bareRepository=explicit` has git discover.

Every git process then runs with the repository pinned (GIT_DIR,
GIT_WORK_TREE), config forced (tools.git.env) and an environment built
whole, not merged into the agent's: a GIT_DIR or GIT_CONFIG_PARAMETERS the
agent inherited cannot redirect it, which GitPython's execute (it copies
os.environ, then updates) could not promise. Everything goes through
argument lists (never a shell), option-looking refs are refused before git
sees them, and paths are confined to the workspace and passed after `--`.
When the workspace is a subdirectory of the repository, the tools see only
that subdirectory (workspace_scope).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.context import ToolContext
from tools.git.env import hardened_git_env
from tools.workspace.bounded_read import read_bounded
from tools.workspace.paths import resolve_path

# Git's messages in English, whatever the user's locale, so errors read the same.
_PLAIN_OUTPUT = {"LANGUAGE": "C", "LC_ALL": "C"}
# No ':' (rev:path names a file, ':/text' searches messages) and no '-' first.
_REF_OK = re.compile(r"^[A-Za-z0-9_./@{}~^+-]+$")
_GITFILE_PREFIX = "gitdir:"
MAX_GITFILE_BYTES = 4096  # a `.git` file or `commondir` holds one path


class GitError(Exception):
    """A git problem explained for the model."""


@dataclass(frozen=True)
class Repository:
    """One repository as the tools use it; all three paths are real (no symlinks)."""

    git_dir: Path  # the repository's own git directory (a linked worktree's, not the common one)
    work_tree: Path  # the top level
    workspace: Path  # where the agent works: the top level or a directory below it

    @property
    def prefix(self) -> str:
        """The workspace relative to the top level, POSIX; "" when it is the top level."""
        relative = self.workspace.relative_to(self.work_tree).as_posix()
        return "" if relative == "." else relative


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _is_git_directory(path: Path) -> bool:
    """What git accepts as a git directory: HEAD, and objects/ and refs/ here or in the
    directory its `commondir` file names (a linked worktree's gitdir)."""
    try:
        if not (path / "HEAD").is_file():
            return False
        common = path
        commondir = path / "commondir"
        if commondir.is_file():
            head = read_bounded(commondir, MAX_GITFILE_BYTES, truncate=True)
            common = path / head.decode("utf-8", errors="replace").strip()
        return (common / "objects").is_dir() and (common / "refs").is_dir()
    except OSError:
        return False


def _gitfile_target(dot_git: Path) -> Path:
    """The git directory a `.git` file names (`gitdir: <path>`, relative to its folder)."""
    try:
        # Bounded and regular-only: a `.git` FIFO or link to /dev/zero must not hang us.
        head = read_bounded(dot_git, MAX_GITFILE_BYTES, truncate=True)
        text = head.decode("utf-8", errors="replace")
    except OSError as exc:
        raise GitError(f"cannot read {dot_git}: {exc.strerror or exc}") from exc
    if not text.startswith(_GITFILE_PREFIX):
        raise GitError(f"{dot_git} is not a valid .git file")
    target = Path(os.path.realpath(dot_git.parent / text[len(_GITFILE_PREFIX) :].strip()))
    if not _is_git_directory(target):
        raise GitError(f"{dot_git} names {target}, which is not a git repository")
    return target


def find_repository(start: Path) -> Repository | None:
    """The work tree containing `start`, found as `safe.bareRepository=explicit` has git
    find it: a directory that merely looks like a git directory is passed over, so a
    bare-shaped folder inside a project never stands in for the project's repository.
    None outside git and inside a git directory; GitError for a broken `.git` file."""
    workspace = Path(os.path.realpath(start))
    for directory in (workspace, *workspace.parents):
        dot_git = directory / ".git"
        if dot_git.is_file():
            git_dir = _gitfile_target(dot_git)
        elif dot_git.is_dir() and _is_git_directory(dot_git):
            git_dir = Path(os.path.realpath(dot_git))
        else:
            continue
        repository = Repository(git_dir=git_dir, work_tree=directory, workspace=workspace)
        inside_git = ".git" in Path(repository.prefix).parts or _is_within(workspace, git_dir)
        return None if inside_git else repository
    return None


def open_repo(start: Path) -> Repository:
    """The repository of the workspace `start`; GitError when there is none."""
    repo = find_repository(start)
    if repo is None:
        raise GitError(f"{start} is not inside a git repository")
    _check_ownership(repo)
    return repo


def _check_ownership(repo: Repository) -> None:
    """Pinning GIT_DIR skips git's own refusal of a repository another user owns
    (`safe.directory`), so when an owner differs, git is asked to discover the
    repository from its top level the way it would check it, and its refusal kept."""
    if not hasattr(os, "geteuid"):
        return
    try:
        owners = {os.stat(repo.work_tree).st_uid, os.stat(repo.git_dir).st_uid}
    except OSError as exc:
        raise GitError(f"cannot inspect the repository at {repo.work_tree}: {exc}") from exc
    if owners == {os.geteuid()}:
        return
    env = hardened_git_env(os.environ)  # nothing pinned: git discovers, and checks the owner
    env["GIT_CEILING_DIRECTORIES"] = os.fspath(repo.work_tree.parent)
    env.update(_PLAIN_OUTPUT)
    found = _spawn(["rev-parse", "--absolute-git-dir"], repo.work_tree, env, None)
    if found.returncode != 0:
        message = found.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git refuses the repository at {repo.work_tree}: {message}")


def repository_env(
    repo: Repository, base: Mapping[str, str] | None = None, *, hooks: bool = False
) -> dict[str, str]:
    """`base` (default: the agent's environment) hardened, with this repository pinned."""
    return hardened_git_env(
        os.environ if base is None else base,
        hooks=hooks,
        git_dir=repo.git_dir,
        work_tree=repo.work_tree,
    )


def _spawn(args: Sequence[str], cwd: Path, env: Mapping[str, str], input_file):
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            env=dict(env),
            stdin=input_file if input_file is not None else subprocess.DEVNULL,
            capture_output=True,
            check=False,
        )
    except FileNotFoundError as exc:
        raise GitError("git is not installed") from exc


def run_git(
    repo: Repository,
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input_file=None,
    ok_codes: Sequence[int] = (0,),
    cwd: Path | None = None,
) -> bytes:
    """Run hardened git (hooks off) in the work tree, or `cwd`, and return stdout bytes;
    GitError (with stderr) on failure. `env` adds variables such as GIT_INDEX_FILE."""
    full_env = repository_env(repo)
    full_env.update(_PLAIN_OUTPUT)
    full_env.update(env or {})
    completed = _spawn(args, cwd or repo.work_tree, full_env, input_file)
    if completed.returncode not in ok_codes:
        message = completed.stderr.decode("utf-8", "replace").strip()
        raise GitError(f"git {args[0]} failed: {message or f'exit code {completed.returncode}'}")
    return completed.stdout


def git_text(repo: Repository, args: Sequence[str], **kwargs) -> str:
    return run_git(repo, args, **kwargs).decode("utf-8", errors="replace")


def has_commits(repo: Repository) -> bool:
    try:
        run_git(repo, ["rev-parse", "--verify", "--quiet", "HEAD^{commit}"])
        return True
    except GitError:
        return False


def verified_ref(repo: Repository, ref: str) -> str:
    """The commit id `ref` names; refuses anything git could read as an option, a range,
    or a path (`HEAD:../secret.txt`)."""
    if not ref or ref.startswith("-") or not _REF_OK.match(ref) or ".." in ref.replace("...", ""):
        raise GitError(f"{ref!r} is not a valid revision name")
    try:
        return git_text(repo, ["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"]).strip()
    except GitError as exc:
        raise GitError(f"unknown revision {ref!r}") from exc


def repo_paths(repo: Repository, ctx: ToolContext, raw_paths: Sequence[str]) -> list[str]:
    """Workspace-confined pathspecs, ready to follow `--`. Only the workspace counts, not
    the extra roots: in a subdirectory workspace the git tools stay inside it."""
    result = []
    for raw in raw_paths:
        resolved = resolve_path(raw, (ctx.workspace,))
        relative = resolved.real.relative_to(repo.work_tree).as_posix()
        # 'top' makes the spec independent of git's cwd; 'literal' stops git from
        # reading glob or magic characters in the name.
        result.append(f":(top,literal){relative}" if relative != "." else ":(top)")
    return result


def workspace_pathspec(repo: Repository) -> str:
    """The pathspec covering the workspace inside its repository."""
    return f":(top,literal){repo.prefix}" if repo.prefix else ":(top)"


def workspace_scope(repo: Repository) -> list[str]:
    """Pathspecs a whole-workspace command needs: none at the top level (a pathspec would
    change what `git log` shows), the workspace when it is a subdirectory."""
    return [workspace_pathspec(repo)] if repo.prefix else []


def relative_to_workspace(repo: Repository) -> list[str]:
    """`--relative` for diff and show in a subdirectory workspace: paths as the tools
    name them, and nothing outside."""
    return [f"--relative={repo.prefix}/"] if repo.prefix else []


def cap_text(text: str, limit: int, hint: str) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    note = f"\n… [output truncated at {limit:,} of {len(text):,} chars; {hint}]"
    return text[:limit] + note, True
