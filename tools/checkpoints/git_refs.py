"""Checkpoints as commits on private refs, built without touching the user's git state.

Snapshot: copy the user's index to a temporary file (so git can reuse its
stat cache), point GIT_INDEX_FILE at the copy, `git add -A` the workspace
into it (git's own ignore rules decide what is left out), `write-tree`,
`commit-tree`, and `update-ref refs/resident/checkpoints/<id>`. HEAD, the
branch, the real index and the stash are never written.

Restore: snapshot the current state, diff that tree against the
checkpoint's, delete what the checkpoint did not have, and check out what
differs through another temporary index. Untracked files larger than a cap
are left out of snapshots (and so are never deleted by a restore), so one
stray dataset does not bloat the repository's object store. Resident's own
folders (config, data, cache) inside the workspace are never added, and a
restore never touches them (tools.workspace.walk).

Git runs hardened (tools.git.repo): the repository pinned, config that would
run programs forced off and hooks off, since nobody approves a checkpoint
(update-ref alone would run a reference-transaction hook).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from tools.checkpoints.protocol import (
    DEFAULT_MAX_FILE_BYTES,
    Change,
    Checkpoint,
    CheckpointError,
    RestoreReport,
    new_checkpoint_id,
)
from tools.git.repo import (
    GitError,
    Repository,
    git_text,
    has_commits,
    open_repo,
    run_git,
    workspace_pathspec,
)
from tools.workspace.safe_fs import remove_empty_parents, remove_file
from tools.workspace.walk import covered, left_out, names_left_out

REF_PREFIX = "refs/resident/checkpoints/"
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_IDENTITY = {
    "GIT_AUTHOR_NAME": "Resident",
    "GIT_AUTHOR_EMAIL": "resident@localhost",
    "GIT_COMMITTER_NAME": "Resident",
    "GIT_COMMITTER_EMAIL": "resident@localhost",
}
_SKIPPED = "Resident-Skipped: "
_GITLINK = "160000"


class GitCheckpointStore:
    kind = "git"

    def __init__(
        self,
        workspace: Path,
        *,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        protected: Iterable[Path] | None = None,
    ) -> None:
        """`protected`: folders never added nor restored, by real path (None: the user's
        Resident folders as this process places them)."""
        self.workspace = Path(os.path.realpath(workspace))
        self.max_file_bytes = max_file_bytes
        self.protected = left_out(self.workspace, protected)
        with self._repo():
            pass  # fail early outside a repository

    @contextmanager
    def _repo(self) -> Iterator[Repository]:
        try:
            repo = open_repo(self.workspace)
        except GitError as exc:
            raise CheckpointError(str(exc)) from exc
        try:
            yield repo
        except GitError as exc:
            raise CheckpointError(str(exc)) from exc

    # -- snapshots ---------------------------------------------------------

    @contextmanager
    def _temporary_index(self, repo: Repository, *, seed: bool) -> Iterator[dict[str, str]]:
        with tempfile.TemporaryDirectory(prefix="resident-index-") as directory:
            index = Path(directory) / "index"
            real_index = repo.git_dir / "index"
            if seed and real_index.is_file():
                # copy2 keeps the index's mtime: git trusts a cached stat only
                # for entries older than the index file, so a fresh mtime would
                # hide a same-size edit made within one clock tick of `git add`.
                shutil.copy2(real_index, index)
            yield {"GIT_INDEX_FILE": str(index)}

    def _large_untracked(
        self, repo: Repository, spec: str, env: dict[str, str], excludes: list[str]
    ) -> list[str]:
        raw = run_git(
            repo,
            ["ls-files", "-z", "--others", "--exclude-standard", "--", spec, *excludes],
            env=env,
        )
        top = repo.work_tree
        large = []
        for item in raw.split(b"\0"):
            if not item:
                continue
            name = os.fsdecode(item)
            try:
                if os.lstat(top / name).st_size > self.max_file_bytes:
                    large.append(name)
            except OSError:
                continue
        return large

    def _snapshot_tree(self, repo: Repository) -> tuple[str, list[str]]:
        spec = workspace_pathspec(repo)
        with self._temporary_index(repo, seed=True) as env:
            protected = [f":(top,exclude,literal){name}" for name in self._protected_names(repo)]
            skipped = self._large_untracked(repo, spec, env, protected)
            excludes = [f":(top,exclude,literal){name}" for name in skipped]
            run_git(repo, ["add", "--all", "--", spec, *excludes, *protected], env=env)
            tree = git_text(repo, ["write-tree"], env=env).strip()
        return tree, skipped

    def _commit(self, repo: Repository, tree: str, label: str, checkpoint_id: str, skipped) -> str:
        message = (label or "checkpoint") + f"\n\nResident-Checkpoint: {checkpoint_id}\n"
        message += "".join(f"{_SKIPPED}{name}\n" for name in skipped)
        parents = ["-p", "HEAD"] if has_commits(repo) else []
        command = ["commit-tree", "--no-gpg-sign", tree, *parents, "-m", message]
        return git_text(repo, command, env=_IDENTITY).strip()

    def create(self, label: str = "") -> Checkpoint:
        with self._repo() as repo:
            return self._create(repo, label)

    def _create(self, repo: Repository, label: str) -> Checkpoint:
        tree, skipped = self._snapshot_tree(repo)
        checkpoint_id = new_checkpoint_id()
        commit = self._commit(repo, tree, label, checkpoint_id, skipped)
        run_git(repo, ["update-ref", REF_PREFIX + checkpoint_id, commit, ""])
        created = float(git_text(repo, ["show", "-s", "--format=%ct", commit]).strip())
        return Checkpoint(checkpoint_id, label, created, tuple(skipped))

    # -- reading -----------------------------------------------------------

    def list(self) -> list[Checkpoint]:
        with self._repo() as repo:
            fmt = "%(refname)%00%(committerdate:unix)%00%(contents)%01"
            raw = git_text(repo, ["for-each-ref", f"--format={fmt}", REF_PREFIX])
        checkpoints = []
        for record in raw.split("\x01"):
            record = record.lstrip("\n")
            if not record:
                continue
            ref, created, contents = record.split("\x00", 2)
            label = contents.split("\n", 1)[0]
            skipped = tuple(
                line[len(_SKIPPED) :] for line in contents.splitlines() if line.startswith(_SKIPPED)
            )
            checkpoint_id = ref[len(REF_PREFIX) :]
            label = "" if label == "checkpoint" else label
            checkpoints.append(Checkpoint(checkpoint_id, label, float(created), skipped))
        return sorted(checkpoints, key=lambda c: c.id)

    def _commit_of(self, repo: Repository, checkpoint_id: str) -> str:
        if not _ID.match(checkpoint_id):
            raise CheckpointError(f"invalid checkpoint id {checkpoint_id!r}")
        try:
            ref = f"{REF_PREFIX}{checkpoint_id}^{{commit}}"
            return git_text(repo, ["rev-parse", "--verify", "--quiet", ref]).strip()
        except GitError as exc:
            raise CheckpointError(f"no checkpoint {checkpoint_id!r}") from exc

    def _protected_names(self, repo: Repository) -> tuple[str, ...]:
        """Resident's folders inside the work tree, relative to its top."""
        return names_left_out(repo.work_tree, self.protected)

    def _diff(self, repo: Repository, current_tree: str, commit: str) -> list[Change]:
        spec = workspace_pathspec(repo)
        protected = self._protected_names(repo)
        raw = run_git(
            repo,
            [
                "diff-tree",
                "-r",
                "-z",
                "--no-renames",
                current_tree,
                f"{commit}^{{tree}}",
                "--",
                spec,
            ],
        )
        fields = raw.split(b"\0")
        changes = []
        for header, path in zip(fields[0::2], fields[1::2], strict=False):
            if not header.startswith(b":"):
                continue
            old_mode, new_mode, _, _, status = header[1:].decode().split(" ")
            if _GITLINK in (old_mode, new_mode):
                continue  # submodules are their own repositories
            name = os.fsdecode(path)
            if protected and covered(name, protected):
                continue  # never written back nor deleted, whatever the checkpoint holds
            changes.append(Change("delete" if status == "D" else "write", name))
        return changes

    def changes(self, checkpoint_id: str) -> list[Change]:
        with self._repo() as repo:
            commit = self._commit_of(repo, checkpoint_id)
            tree, _ = self._snapshot_tree(repo)
            return self._diff(repo, tree, commit)

    # -- restoring ---------------------------------------------------------

    def restore(self, checkpoint_id: str, *, save_current: bool = True) -> RestoreReport:
        with self._repo() as repo:
            commit = self._commit_of(repo, checkpoint_id)
            target = next(c for c in self.list() if c.id == checkpoint_id)
            before = (
                self._create(repo, f"before restoring {checkpoint_id}") if save_current else None
            )
            current = (
                f"{REF_PREFIX}{before.id}^{{tree}}" if before else self._snapshot_tree(repo)[0]
            )
            changes = self._diff(repo, current, commit)
            top = repo.work_tree
            deleted = [c.path for c in changes if c.action == "delete"]
            written = [c.path for c in changes if c.action == "write"]
            for path in sorted(deleted, key=lambda p: p.count("/"), reverse=True):
                if remove_file(top, PurePosixPath(path)):
                    remove_empty_parents(top, PurePosixPath(path))
            problems = self._check_out(repo, commit, written)
        return RestoreReport(target, tuple(written), tuple(deleted), before, tuple(problems))

    def _check_out(self, repo: Repository, commit: str, paths: list[str]) -> list[str]:
        if not paths:
            return []
        with self._temporary_index(repo, seed=False) as env:
            run_git(repo, ["read-tree", commit], env=env)
            with tempfile.TemporaryFile() as listing:
                listing.write(b"\0".join(os.fsencode(p) for p in paths) + b"\0")
                listing.seek(0)
                try:
                    run_git(
                        repo, ["checkout-index", "-f", "-z", "--stdin"], env=env, input_file=listing
                    )
                except GitError as exc:
                    return [str(exc)]
        return []

    def delete(self, checkpoint_id: str) -> None:
        with self._repo() as repo:
            self._commit_of(repo, checkpoint_id)
            run_git(repo, ["update-ref", "-d", REF_PREFIX + checkpoint_id])
