"""The git tools: status, diff, log (read) and commit (runs the repository's hooks).

Every git process runs hardened (tools.git.repo, tools.git.env): the repository
pinned, config that would run programs forced off, and hooks only for the
commit, which the permission policy has the user approve. In a workspace that
is a subdirectory of its repository, every tool is limited to that
subdirectory and names paths relative to it.
"""

from __future__ import annotations

from pydantic import Field

from tools.base import Arguments, Effect, Tool, ToolAccess, ToolResult
from tools.context import ToolContext
from tools.git.commit_sandbox import sandboxed_commit, sign_last_commit
from tools.git.repo import (
    GitError,
    Repository,
    cap_text,
    git_text,
    has_commits,
    open_repo,
    relative_to_workspace,
    repo_paths,
    repository_env,
    run_git,
    verified_ref,
    workspace_pathspec,
    workspace_scope,
)
from tools.process.environment import scrubbed_environment
from tools.process.run import run_process
from tools.workspace.paths import PathError


class GitStatusArgs(Arguments):
    pass


class GitStatusTool(Tool):
    name = "git_status"
    description = (
        "Show the branch and the changed, staged and untracked files (git status --short)."
    )
    effect = Effect.READ
    Args = GitStatusArgs

    def access(self, args: GitStatusArgs) -> ToolAccess:
        return ToolAccess(effect=self.effect, summary="git status")

    def run(self, args: GitStatusArgs, ctx: ToolContext) -> ToolResult:
        try:
            repo = open_repo(ctx.workspace)
            # Run from the workspace so the short format names paths relative to it.
            command = ["-c", "status.relativePaths=true", "status", "--short", "--branch"]
            command += ["--no-ahead-behind", "--", *workspace_scope(repo)]
            text = git_text(repo, command, cwd=repo.workspace)
        except GitError as exc:
            return ToolResult.error(str(exc))
        text, cut = cap_text(text.rstrip("\n"), ctx.limits.diff_max_chars, "many files changed")
        lines = text.splitlines()
        if len(lines) <= 1:
            text += "\n(nothing to commit, working tree clean)"
        return ToolResult.success(text, truncated=cut)


class GitDiffArgs(Arguments):
    staged: bool = Field(default=False, description="Show staged changes (the index) instead.")
    ref: str | None = Field(
        default=None, description="Compare against this commit, branch or tag (e.g. 'HEAD~1')."
    )
    paths: list[str] = Field(default_factory=list, description="Limit the diff to these paths.")
    stat: bool = Field(default=False, description="Only a per-file summary of changes.")


class GitDiffTool(Tool):
    name = "git_diff"
    description = (
        "Show changes as a unified diff: work tree against the index by default, the "
        "index with staged=true, or against a ref (work tree, or index when staged)."
    )
    effect = Effect.READ
    Args = GitDiffArgs

    def access(self, args: GitDiffArgs) -> ToolAccess:
        what = "staged changes" if args.staged else "changes"
        against = f" against {args.ref}" if args.ref else ""
        return ToolAccess(
            effect=self.effect, summary=f"git diff ({what}{against})", paths=tuple(args.paths)
        )

    def run(self, args: GitDiffArgs, ctx: ToolContext) -> ToolResult:
        command = ["diff", "--no-color", "--no-ext-diff"]
        if args.stat:
            command.append("--stat")
        try:
            repo = open_repo(ctx.workspace)
            command += relative_to_workspace(repo)
            if args.staged:
                command.append("--cached")
            if args.ref:
                command.append(verified_ref(repo, args.ref))
            paths = repo_paths(repo, ctx, args.paths) or workspace_scope(repo)
            text = git_text(repo, [*command, "--", *paths])
        except (GitError, PathError) as exc:
            return ToolResult.error(str(exc))
        if not text.strip():
            return ToolResult.success("(no differences)")
        text, cut = cap_text(text, ctx.limits.diff_max_chars, "pass paths to narrow it")
        return ToolResult.success(text, truncated=cut)


class GitLogArgs(Arguments):
    max_count: int = Field(default=20, ge=1, le=200, description="How many commits to show.")
    ref: str | None = Field(default=None, description="Start from this ref instead of HEAD.")
    path: str | None = Field(default=None, description="Only commits touching this path.")


class GitLogTool(Tool):
    name = "git_log"
    description = "Show recent commits: short hash, date, author and subject, newest first."
    effect = Effect.READ
    Args = GitLogArgs

    def access(self, args: GitLogArgs) -> ToolAccess:
        paths = (args.path,) if args.path else ()
        return ToolAccess(effect=self.effect, summary="git log", paths=paths)

    def run(self, args: GitLogArgs, ctx: ToolContext) -> ToolResult:
        command = [
            "log",
            f"--max-count={args.max_count}",
            "--date=short",
            "--format=%h %ad %an: %s",
        ]
        try:
            repo = open_repo(ctx.workspace)
            if not has_commits(repo) and not args.ref:
                return ToolResult.success("(no commits yet)")
            command.append(verified_ref(repo, args.ref) if args.ref else "HEAD")
            paths = repo_paths(repo, ctx, [args.path]) if args.path else workspace_scope(repo)
            text = git_text(repo, [*command, "--", *paths])
        except (GitError, PathError) as exc:
            return ToolResult.error(str(exc))
        return ToolResult.success(text.rstrip("\n") or "(no commits match)")


class GitCommitArgs(Arguments):
    message: str = Field(min_length=1, description="The commit message.")
    paths: list[str] = Field(
        default_factory=list, description="Stage these paths before committing."
    )
    stage_all: bool = Field(
        default=False, description="Stage every change first, new files included (git add -A)."
    )
    allow_empty: bool = Field(default=False, description="Commit even with nothing staged.")
    no_verify: bool = Field(
        default=False,
        description="Skip the repository's commit hooks. Only when the user asked for it.",
    )


class GitCommitTool(Tool):
    name = "git_commit"
    description = (
        "Commit staged changes (optionally staging paths or everything first). The "
        "repository's hooks run; if a hook fails, the commit is not made and its output "
        "is returned."
    )
    # Hooks run code from the repository, so a commit is treated like running a command.
    effect = Effect.EXECUTE
    Args = GitCommitArgs

    def access(self, args: GitCommitArgs) -> ToolAccess:
        subject = args.message.strip().splitlines()[0] if args.message.strip() else ""
        escalation = (
            "the commit would skip the repository's hooks (--no-verify)" if args.no_verify else None
        )
        return ToolAccess(
            effect=self.effect,
            summary=f"git commit: {subject}",
            paths=tuple(args.paths),
            escalation=escalation,
            runs_repository_code=not args.no_verify,
        )

    def run(self, args: GitCommitArgs, ctx: ToolContext) -> ToolResult:
        try:
            repo = open_repo(ctx.workspace)
            outside = _staged_outside_workspace(repo)
            if outside:
                return ToolResult.error(
                    f"{outside} staged change(s) outside the workspace {repo.workspace} would "
                    "go into this commit; the user must commit or unstage them first."
                )
            if args.stage_all:  # everything in the workspace, not the whole repository
                run_git(repo, ["add", "-A", "--", workspace_pathspec(repo)])
            if args.paths:
                run_git(repo, ["add", "--", *repo_paths(repo, ctx, args.paths)])
            command = ["git", "commit", "--no-edit", "-m", args.message]
            if args.no_verify:
                command.append("--no-verify")
            if args.allow_empty:
                command.append("--allow-empty")
            sign_after = False
            if ctx.sandbox is not None and not args.no_verify:
                # Hooks are repository code a command may have just rewritten: they
                # run confined, with the commit.
                outcome, sign_after = sandboxed_commit(repo, command, ctx)
            else:
                outcome = run_process(
                    command,
                    cwd=repo.work_tree,
                    # Without a sandbox the hooks run as the user: the policy asks first.
                    env=repository_env(repo, scrubbed_environment(ctx.base_env()), hooks=True),
                    timeout_s=ctx.limits.shell_timeout_s,
                    output_limit=ctx.limits.shell_output_chars,
                    cancel_event=ctx.cancel_event,
                    kill_grace_s=ctx.limits.shell_kill_grace_s,
                )
            if not outcome.succeeded:
                why = "timed out" if outcome.timed_out else f"exit code {outcome.exit_code}"
                return ToolResult.error(
                    f"git commit failed ({why}); nothing was committed.\n{outcome.output}",
                    exit_code=outcome.exit_code,
                )
            if sign_after:
                sign_last_commit(repo, ctx)
            commit = git_text(repo, ["rev-parse", "HEAD"]).strip()
            show = ["show", "--stat", "--no-ext-diff", *relative_to_workspace(repo)]
            summary = git_text(repo, [*show, "--format=%h %s", "HEAD"])
        except (GitError, PathError) as exc:
            return ToolResult.error(str(exc))
        text = summary.rstrip("\n")
        if outcome.output.strip():
            text += "\n\n" + outcome.output.rstrip("\n")
        return ToolResult.success(text, truncated=outcome.truncated, commit=commit)


def _staged_outside_workspace(repo: Repository) -> int:
    """How many staged paths lie outside a subdirectory workspace. `git commit` takes the
    whole index, so a commit from the workspace would carry them along; their names are
    not the model's to see, only their number."""
    if not repo.prefix:
        return 0
    spec = [":(top)", f":(top,exclude,literal){repo.prefix}"]
    raw = run_git(repo, ["diff", "--cached", "--name-only", "-z", "--no-renames", "--", *spec])
    return len([name for name in raw.split(b"\0") if name])
