"""Workspace confinement: every path a tool touches is resolved, symlinks included,
and must lie inside the workspace or a root the user allowed.

Also the classification of paths that deserve a human's eye even inside the
workspace: git internals and files that usually hold secrets.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath


class PathError(ValueError):
    """A path a tool must not use; the message is written for the model."""


class OutsideWorkspaceError(PathError):
    pass


@dataclass(frozen=True)
class ResolvedPath:
    """A path after resolution: `real` has no symlinks and lies under `root`."""

    requested: str
    real: Path
    root: Path
    relative: PurePosixPath  # `real` relative to `root`; "." for the root itself
    in_workspace: bool = True  # False when `root` is one of the extra allowed roots

    @property
    def display(self) -> str:
        """How to show the path to the model: relative for the workspace, absolute otherwise."""
        return str(self.relative) if self.in_workspace else str(self.real)

    @property
    def is_git_internal(self) -> bool:
        return ".git" in self.relative.parts


def _is_within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def resolve_path(raw: str, roots: Sequence[Path], base: Path | None = None) -> ResolvedPath:
    """Resolve `raw` (relative to `base`, default the first root) and confine it.

    `roots` must already be real paths. Raises PathError with a message fit
    for the model when the path is empty, malformed or escapes every root,
    whether by `..`, by an absolute path or through a symbolic link.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise PathError("path is empty")
    if "\x00" in raw:
        raise PathError("path contains a NUL byte")
    if not roots:
        raise PathError("no workspace is configured")
    expanded = os.path.expanduser(raw)
    joined = Path(expanded) if os.path.isabs(expanded) else (base or roots[0]) / expanded
    lexical = Path(os.path.normpath(joined))
    try:
        real = Path(os.path.realpath(joined))
    except (OSError, RuntimeError) as exc:  # e.g. /proc/1/root: a link it may not read
        raise OutsideWorkspaceError(
            f"{raw!r} cannot be resolved ({exc}); tools may only touch files inside the workspace."
        ) from exc
    for index, root in enumerate(roots):
        if _is_within(real, root):
            relative = PurePosixPath(real.relative_to(root).as_posix() or ".")
            return ResolvedPath(
                requested=raw, real=real, root=root, relative=relative, in_workspace=index == 0
            )
    via_link = any(_is_within(lexical, root) for root in roots)
    how = " through a symbolic link" if via_link else ""
    raise OutsideWorkspaceError(
        f"{raw!r} resolves{how} to {real}, which is outside the workspace {roots[0]}. "
        "Tools may only touch files inside the workspace."
    )


# Names of files that commonly hold credentials. Templates that are meant to be
# committed (".env.example") are not secrets.
SECRET_FILE_GLOBS = (
    ".env",
    ".env.*",
    ".envrc",
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    ".pgpass",
    ".git-credentials",
    ".htpasswd",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.kdbx",
    "credentials",
    "credentials.json",
)
_NOT_SECRET_SUFFIXES = (".example", ".sample", ".template", ".dist", ".pub")
# Directories whose whole content is credentials or keys.
SECRET_DIR_NAMES = frozenset({".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", "gcloud"})


def is_secret_name(name: str) -> bool:
    if name.endswith(_NOT_SECRET_SUFFIXES):
        return False
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in SECRET_FILE_GLOBS)


def secret_reason(path: Path) -> str | None:
    """Why `path` probably holds secrets, or None."""
    for part in path.parts[:-1]:
        if part in SECRET_DIR_NAMES:
            return f"it is inside a {part} directory, which usually holds credentials"
    if path.name in SECRET_DIR_NAMES:
        return f"{path.name} usually holds credentials"
    if is_secret_name(path.name):
        return f"files named like {path.name} usually hold secrets"
    return None


def sensitivity(resolved: ResolvedPath) -> str | None:
    """Why a human should approve touching this path, or None if nothing special."""
    if resolved.is_git_internal:
        return "it is inside .git (repository internals; use the git tools)"
    return secret_reason(resolved.real)
