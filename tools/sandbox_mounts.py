"""What a sandboxed command sees of the filesystem: bubblewrap mount arguments, in order.

The system directories are there, read-only. Everything else of the host is
absent: the user's home (but for the toolchains on PATH, read-only, so
`python` from pyenv or `cargo` still run), other users, /tmp, /run and its
sockets, /mnt, /srv and any other top-level folder. The workspace is bound at
its own path, writable only when the call was granted writes; its `.git` (and
the gitdir a `.git` file names) and the project's own config are read-only
on top, so no command can plant a hook or rewrite config that a later git
run outside the sandbox would obey. A command that runs unasked also finds
the workspace's secret files (.env, keys) replaced by empty ones.

bubblewrap applies the arguments in order, so later mounts land on top of
earlier ones: system, then private scratch space, then toolchains, then the
workspace, then the read-only and masked paths inside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.paths import SECRET_DIR_NAMES, is_secret_name

# Top-level folders that hold the operating system and installed software.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "nix", "var")
# Inside those, what is user data or host state rather than software.
HIDDEN_SYSTEM_PATHS = ("/var/tmp", "/var/mail", "/var/spool", "/var/log", "/var/backups")
# Files of /etc that hold secrets readable by root.
ETC_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
# Toolchain folders under a home whose parent also holds credentials: only the
# PATH entry itself is bound, never its parent.
CREDENTIAL_PARENTS = frozenset({".local", ".cargo", ".config", ".npm", ".gem", ".m2", ".gradle"})
# Project configuration the agent reads: a command may never rewrite it.
PROJECT_CONFIG = (".residentignore", ".resident")
# Folders the secret scan does not enter: dependencies and caches, not the user's secrets.
_SCAN_SKIP = frozenset({".git", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"})
SECRET_SCAN_LIMIT = 200_000  # directory entries; past it the scan stops and says so


@dataclass(frozen=True)
class MountPlan:
    """Everything that decides the mounts, resolved to real paths by the caller."""

    workspace: Path
    extra_roots: tuple[Path, ...] = ()
    writable: bool = False
    network: bool = False
    home: Path | None = None
    toolchains: tuple[Path, ...] = ()
    read_only_paths: tuple[Path, ...] = ()
    masked: tuple[Path, ...] = ()


def system_mounts(root: Path = Path("/")) -> list[str]:
    args: list[str] = []
    for name in SYSTEM_DIRS:
        path = root / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), f"/{name}"]
        elif path.is_dir():
            args += ["--ro-bind", str(path), f"/{name}"]
    for hidden in HIDDEN_SYSTEM_PATHS:
        if os.path.isdir(hidden) and not os.path.islink(hidden):
            args += ["--tmpfs", hidden]
    for secret in ETC_SECRETS:
        if os.path.isfile(secret):
            args += ["--ro-bind", os.devnull, secret]
    return args


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _is_system(path: Path) -> bool:
    return len(path.parts) > 1 and path.parts[1] in SYSTEM_DIRS


def toolchain_dirs(path_variable: str, home: Path | None, workspace: Path) -> list[Path]:
    """Folders outside the system directories that PATH needs: each entry, or the
    toolchain prefix holding it (`~/.pyenv` for `~/.pyenv/shims`), never a home itself."""
    found: dict[Path, None] = {}
    for entry in path_variable.split(os.pathsep):
        if not entry or not os.path.isabs(entry) or not os.path.isdir(entry):
            continue
        real = Path(os.path.realpath(entry))
        if _is_system(real) or _inside(real, [workspace]) or real == Path("/"):
            continue
        chosen = real
        parent = real.parent
        if real.name in ("bin", "sbin", "shims") and parent != home and parent != Path("/"):
            if parent.name not in CREDENTIAL_PARENTS and parent.name not in SECRET_DIR_NAMES:
                chosen = parent
                # ~/.pyenv/plugins/x/shims: the plugin lives inside the toolchain.
                if parent.parent.name == "plugins" and parent.parent.parent != home:
                    chosen = parent.parent.parent
        if home is not None and chosen == home:
            continue
        found[chosen] = None
    if home is not None and (home / ".cargo" / "bin") in found and (home / ".rustup").is_dir():
        found[Path(os.path.realpath(home / ".rustup"))] = None  # rustup's proxies need it
    return _outermost(found)


def venv_base_prefixes(workspace: Path) -> list[Path]:
    """The interpreters that virtual environments in the workspace were made from."""
    prefixes = []
    for name in (".venv", "venv", "env", ".env"):
        config = workspace / name / "pyvenv.cfg"
        try:
            if config.is_symlink() or not config.is_file():
                continue
            lines = config.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "home" and os.path.isabs(value.strip()):
                bin_dir = Path(os.path.realpath(value.strip()))
                prefix = bin_dir.parent if bin_dir.name == "bin" else bin_dir
                if not _is_system(prefix) and prefix != Path("/"):
                    prefixes.append(prefix)
    return prefixes


def _outermost(paths) -> list[Path]:
    ordered = sorted(set(paths), key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in ordered:
        if not _inside(path, kept):
            kept.append(path)
    return kept


def git_dirs(workspace: Path) -> list[Path]:
    """The workspace's `.git`, and for a `.git` file (worktree, submodule) the gitdir it
    names and that gitdir's common directory."""
    dot_git = workspace / ".git"
    if dot_git.is_dir() and not dot_git.is_symlink():
        return [dot_git]
    if not dot_git.is_file():
        return []
    result = [dot_git]
    try:
        text = dot_git.read_text(errors="replace").strip()
    except OSError:
        return result
    if text.startswith("gitdir:"):
        gitdir = Path(os.path.realpath(workspace / text[len("gitdir:") :].strip()))
        if gitdir.is_dir():
            result.append(gitdir)
            common = gitdir / "commondir"
            if common.is_file():
                try:
                    target = common.read_text(errors="replace").strip()
                    result.append(Path(os.path.realpath(gitdir / target)))
                except OSError:
                    pass
    return result


def secret_files(workspace: Path, limit: int = SECRET_SCAN_LIMIT) -> tuple[list[Path], bool]:
    """Secret-looking files and folders in the workspace (no symlink followed), and
    whether the scan finished within `limit` entries."""
    found: list[Path] = []
    seen = 0
    stack = [workspace]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    seen += 1
                    if seen > limit:
                        return found, False
                    path = Path(entry.path)
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name in SECRET_DIR_NAMES:
                            found.append(path)
                        elif entry.name not in _SCAN_SKIP and not (path / "pyvenv.cfg").exists():
                            stack.append(path)
                    elif is_secret_name(entry.name) and not entry.is_symlink():
                        found.append(path)
        except OSError:
            continue
    return found, True


def _bind(path: Path, *, writable: bool) -> list[str]:
    return ["--bind" if writable else "--ro-bind", str(path), str(path)]


def workspace_mounts(plan: MountPlan) -> Iterator[str]:
    """Scratch space, toolchains, the workspace and what lies read-only or masked on it."""
    yield from ("--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm")
    if plan.home is not None and not _is_system(plan.home):
        yield from ("--tmpfs", str(plan.home))
    for path in _outermost([*plan.toolchains, *plan.read_only_paths]):
        if not _inside(path, [plan.workspace, *plan.extra_roots]):
            yield from ("--ro-bind-try", str(path), str(path))
    if plan.network:
        resolv = Path(os.path.realpath("/etc/resolv.conf"))
        if resolv.is_file() and not _is_system(resolv):
            yield from ("--ro-bind", str(resolv), str(resolv))
    for root in (plan.workspace, *plan.extra_roots):
        yield from _bind(root, writable=plan.writable)
    protected = [*git_dirs(plan.workspace), *(plan.workspace / n for n in PROJECT_CONFIG)]
    for path in protected:
        if os.path.lexists(path) and not path.is_symlink():
            yield from _bind(path, writable=False)
    for path in plan.masked:
        if path.is_dir():
            yield from ("--tmpfs", str(path), "--remount-ro", str(path))
        else:
            yield from ("--ro-bind", os.devnull, str(path))
