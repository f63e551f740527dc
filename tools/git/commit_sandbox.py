"""`git commit` with the repository's hooks run inside the sandbox.

A hook is code from the repository, and with `core.hooksPath` pointing into
the work tree (husky, `.githooks/`), or a hook that reads workspace config
(lint-staged, pre-commit), it is code a sandboxed command may have written
moments before. Running it on the host would undo the sandbox. So the
commit itself runs in the sandbox: the work tree and the git directory
writable (a commit writes objects, the index and refs; hooks may fix
files), nothing else of the host, no network, the usual process limits.

The user's own git config is not in there (the home is empty), so what a
commit needs from it is read outside and passed in: the identity, the hooks
path. A commit the user's config wants signed is made unsigned inside and
signed outside by an amend that runs no hooks, so no key or agent socket
enters the sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tools.context import ToolContext
from tools.git.env import NON_INTERACTIVE_GIT, forced_config_env, pinned_repository_env
from tools.git.repo import (
    MAX_GITFILE_BYTES,
    GitError,
    Repository,
    git_text,
    repository_env,
    run_git,
)
from tools.process.environment import command_environment
from tools.process.limits import Limits
from tools.process.run import ProcessOutcome, run_process
from tools.sandbox.grants import SandboxGrant
from tools.workspace.bounded_read import read_bounded


def _config(repo: Repository, key: str, *flags: str) -> str | None:
    """The user's and the repository's own value: reading config runs no program, so
    the forced config (hooks off, signing off) is left out of this one read."""
    try:
        value = git_text(repo, ["config", *flags, "--get", key], env={"GIT_CONFIG_COUNT": "0"})
        value = value.strip()
    except GitError:
        return None
    return value or None


def _identity(repo: Repository) -> dict[str, str]:
    env = {}
    name, email = _config(repo, "user.name"), _config(repo, "user.email")
    if name:
        env["GIT_AUTHOR_NAME"] = env["GIT_COMMITTER_NAME"] = name
    if email:
        env["GIT_AUTHOR_EMAIL"] = env["GIT_COMMITTER_EMAIL"] = email
    return env


def _hooks_path(repo: Repository) -> Path | None:
    raw = _config(repo, "core.hooksPath", "--path")
    if raw is None:
        return None
    path = Path(raw) if os.path.isabs(raw) else repo.work_tree / raw
    return Path(os.path.realpath(path))


def wants_signature(repo: Repository) -> bool:
    return _config(repo, "commit.gpgSign", "--type=bool") == "true"


def sandboxed_commit(
    repo: Repository, command: Sequence[str], ctx: ToolContext
) -> tuple[ProcessOutcome, bool]:
    """Run `command` (a `git commit ...` argv) in the sandbox; (outcome, whether it
    still has to be signed outside)."""
    assert ctx.sandbox is not None
    sign = wants_signature(repo)
    hooks_path = _hooks_path(repo)
    extra: list[tuple[str, str]] = [("commit.gpgSign", "false")]
    if hooks_path is not None:
        extra.append(("core.hooksPath", str(hooks_path)))
    base = ctx.base_env()
    home = base.get("HOME") or os.path.expanduser("~")
    env = command_environment(
        base,
        home=home,
        tmpdir="/tmp",
        extra_names=ctx.sandbox_settings.env_names,
        extra={
            **NON_INTERACTIVE_GIT,
            **forced_config_env(hooks=True, signing=False, extra=extra),
            **pinned_repository_env(repo.git_dir, repo.work_tree),
            **_identity(repo),
        },
    )
    # The work tree (a subdirectory workspace commits the whole index) and a git
    # directory that lives elsewhere (worktrees, --separate-git-dir) are writable.
    roots = [repo.work_tree, *_git_roots_outside(repo)]
    read_only = (hooks_path,) if hooks_path and not _inside(hooks_path, roots) else ()
    argv = ctx.sandbox.wrap(
        list(command),
        workspace=repo.work_tree,
        cwd=repo.work_tree,
        grant=SandboxGrant(write=True),
        extra_roots=roots[1:],
        env=base,
        settings=ctx.sandbox_settings,
        git_writable=True,
        extra_read_only=read_only,
    )
    limits = ctx.limits
    outcome = run_process(
        argv,
        cwd=repo.work_tree,
        env=env,
        timeout_s=limits.shell_timeout_s,
        output_limit=limits.shell_output_chars,
        cancel_event=ctx.cancel_event,
        process_budget=limits.shell_process_budget,
        kill_grace_s=limits.shell_kill_grace_s,
        limits=Limits(cpu_seconds=limits.shell_cpu_seconds, file_bytes=limits.shell_max_file_bytes),
    )
    return outcome, sign


def sign_last_commit(repo: Repository, ctx: ToolContext) -> None:
    """Sign HEAD as the user's config says, outside the sandbox, running no hook."""
    env = repository_env(repo, ctx.base_env(), hooks=False)
    env.update(forced_config_env(hooks=False, signing=True))
    run_git(repo, ["commit", "--amend", "--no-edit", "--no-verify", "-S"], env=env)


def _git_roots_outside(repo: Repository) -> list[Path]:
    roots = [repo.git_dir]
    common = repo.git_dir / "commondir"
    if common.is_file():
        head = read_bounded(common, MAX_GITFILE_BYTES, truncate=True)
        target = head.decode("utf-8", errors="replace").strip()
        roots.append(Path(os.path.realpath(repo.git_dir / target)))
    return [r for r in roots if not _inside(r, [repo.work_tree])]


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)
