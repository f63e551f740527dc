"""What a sandboxed command sees of the filesystem: bubblewrap mount arguments, in order.

The system directories are there, read-only. Everything else of the host is
absent: the user's home (but for the toolchains on PATH, read-only, so
`python` from pyenv or `cargo` still run), other users, /tmp, /run and its
sockets, /mnt, /srv and any other top-level folder. The workspace is bound at
its own path, writable only when the call was granted writes; its `.git` (and
the gitdir a `.git` file names), the project's own config and Resident's own
folders where they lie inside it (Resident run in $HOME) are read-only on
top, so no command can plant a hook or rewrite config that a later git run
or session outside the sandbox would obey; a workspace inside one of those
folders is read-only whole. A command that runs unasked also finds the
workspace's secret files (.env, keys), and Resident's config and data
folders, replaced by empty ones.

bubblewrap applies the arguments in order, so later mounts land on top of
earlier ones: system, then private scratch space, then toolchains, then the
workspace, then the read-only and masked paths inside it.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.workspace.bounded_read import read_bounded
from tools.workspace.paths import SECRET_DIR_NAMES, is_secret_name
from tools.workspace.protected import PROJECT_CONFIG

# Top-level folders that hold the operating system and installed software.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "nix", "var")
# Inside those, what is user data or host state rather than software.
HIDDEN_SYSTEM_PATHS = ("/var/tmp", "/var/mail", "/var/spool", "/var/log", "/var/backups")
# Files of /etc that hold secrets readable by root.
ETC_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-", "/etc/sudoers")
# Toolchain folders under a home whose parent also holds credentials: only the
# PATH entry itself is bound, never its parent.
CREDENTIAL_PARENTS = frozenset({".local", ".cargo", ".config", ".npm", ".gem", ".m2", ".gradle"})
# Folders the secret scan does not enter: installed dependencies and caches, never where
# a user keeps secrets. Judged by name only: a marker file (a pyvenv.cfg) would let a
# hostile repository switch the scan off beside the user's own .env.
_SCAN_SKIP = frozenset(
    {".git", "node_modules", "site-packages", "dist-packages", "__pycache__", ".mypy_cache",
     ".ruff_cache", ".pytest_cache", ".tox", ".nox"}
)  # fmt: skip
# pyvenv.cfg, a `.git` file, `commondir`: a few lines the repository wrote; only their head
# is read, so a link to /dev/zero or a huge file cannot stall a sandbox's set-up.
MAX_POINTER_FILE_BYTES = 64 * 1024
SECRET_SCAN_LIMIT = 200_000  # directory entries; past it the scan stops and says so
# Where a host keeps files only root may read (keys, databases, private logs).
ROOT_PRIVATE_SCAN = ("/etc", "/var")


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
    masked: tuple[Path, ...] = ()  # files and folders, kept within mask_budget's limits
    git_writable: bool = False  # only for the git tool's own commit
    # Resident's own folders (config, data, cache) by real path: read-only wherever they
    # meet the roots (tools.workspace.protected).
    state_dirs: tuple[Path, ...] = ()


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
    for private in root_private_paths():
        if not os.path.lexists(private):
            continue  # gone since the scan: masking it would fail the whole sandbox
        if private.is_dir():
            args += ["--tmpfs", str(private), "--remount-ro", str(private)]
        else:
            args += ["--ro-bind", os.devnull, str(private)]
    return args


_private_scan: tuple[float, tuple[Path, ...]] | None = None
PRIVATE_SCAN_TTL_S = 60.0


def root_private_paths() -> tuple[Path, ...]:
    """What of the bound system directories a command must not reach: Unix sockets
    (a read-only bind does not stop connect(): a database or container daemon would
    answer with network off) and, when running as root, files and folders only their
    owner may read.

    Run as root, a sandboxed process is still uid 0 on the host's files (a user
    namespace maps it there, and owner permissions need no capability), so
    whatever is private to root (ssh host keys, /etc/ssl/private, database
    folders) would be readable. Those are masked. The scan (about 7,000
    entries, 0.1 s here) is reused for a minute: only the host's
    administrator can add such files, never a sandboxed command.
    """
    global _private_scan
    now = time.monotonic()
    if _private_scan is None or now - _private_scan[0] > PRIVATE_SCAN_TTL_S:
        _private_scan = (now, _scan_private(ROOT_PRIVATE_SCAN))
    return _private_scan[1]


def forget_private_scan() -> None:
    global _private_scan
    _private_scan = None


def _scan_private(tops: tuple[str, ...]) -> tuple[Path, ...]:
    root_user = os.geteuid() == 0
    found: list[Path] = []
    for top in tops:
        for root, dirs, files in os.walk(top):
            for name in [*dirs, *files]:
                path = os.path.join(root, name)
                try:
                    info = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISLNK(info.st_mode) or path in HIDDEN_SYSTEM_PATHS:
                    continue
                private_dir = stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IXOTH
                private_file = stat.S_ISREG(info.st_mode) and not info.st_mode & stat.S_IROTH
                if stat.S_ISSOCK(info.st_mode) or (root_user and (private_dir or private_file)):
                    found.append(Path(path))
            dirs[:] = [d for d in dirs if Path(root, d) not in found]
    return tuple(found)


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


def venv_base_prefixes(workspace: Path, home: Path | None = None) -> list[Path]:
    """The interpreters that virtual environments in the workspace were made from.

    pyvenv.cfg is the repository's own file, so its `home =` is untrusted: it
    counts only when it names a real Python installation (a standard library
    beside it) that is neither /, the user's home or a folder above it, nor in
    or under a folder that holds credentials. Otherwise `home = /root` would
    show the whole home to every sandboxed command."""
    prefixes = []
    for name in (".venv", "venv", "env", ".env"):
        config = workspace / name / "pyvenv.cfg"
        try:
            if config.is_symlink() or not config.is_file():
                continue
            head = read_bounded(config, MAX_POINTER_FILE_BYTES, truncate=True)
            lines = head.decode(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "home" and os.path.isabs(value.strip()):
                bin_dir = Path(os.path.realpath(value.strip()))
                prefix = bin_dir.parent if bin_dir.name == "bin" else bin_dir
                if not _is_system(prefix) and is_python_install(prefix, home):
                    prefixes.append(prefix)
    return prefixes


def may_show_folder(folder: Path, home: Path | None) -> bool:
    """A folder a sandbox may show whole on a file's say-so (a venv's `home =`, an
    interpreter's install): not /, not the home or above it, not a folder that
    usually holds credentials nor anything inside a secret folder."""
    if folder == Path("/") or folder.name in CREDENTIAL_PARENTS:
        return False
    if any(part in SECRET_DIR_NAMES for part in folder.parts):
        return False
    return home is None or not (folder == home or folder in home.parents)


def is_python_install(prefix: Path, home: Path | None) -> bool:
    """A Python installation (lib/pythonX.Y/os.py) that may be shown whole."""
    if not may_show_folder(prefix, home):
        return False
    try:
        return any((lib / "os.py").is_file() for lib in (prefix / "lib").glob("p*[0-9]*"))
    except OSError:
        return False


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
        text = read_bounded(dot_git, MAX_POINTER_FILE_BYTES, truncate=True)
        text = text.decode(errors="replace").strip()
    except OSError:
        return result
    if text.startswith("gitdir:"):
        gitdir = Path(os.path.realpath(workspace / text[len("gitdir:") :].strip()))
        if gitdir.is_dir():
            result.append(gitdir)
            common = gitdir / "commondir"
            if common.is_file():
                try:
                    head = read_bounded(common, MAX_POINTER_FILE_BYTES, truncate=True)
                    target = head.decode(errors="replace").strip()
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
                        elif entry.name not in _SCAN_SKIP:
                            stack.append(path)
                    elif is_secret_name(entry.name) and not entry.is_symlink():
                        found.append(path)
        except OSError:
            continue
    return found, True


def _bind(path: Path, *, writable: bool) -> list[str]:
    return ["--bind" if writable else "--ro-bind", str(path), str(path)]


# Kernel interfaces under /proc that stay global even in a new PID namespace: a
# process that is root on the host could set sysctls (core_pattern runs a program as
# host root), trigger sysrq, or read kernel memory. Read-only or hidden, as container
# runtimes do.
PROC_READ_ONLY = ("/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq")
PROC_HIDDEN = ("/proc/sysrq-trigger", "/proc/kcore", "/proc/keys", "/proc/timer_list",
               "/proc/sched_debug", "/proc/latency_stats", "/proc/kallsyms")  # fmt: skip


def proc_mounts() -> Iterator[str]:
    yield from ("--proc", "/proc")
    for path in PROC_READ_ONLY:
        if os.path.isdir(path):
            yield from ("--ro-bind", path, path)
    for path in PROC_HIDDEN:
        if os.path.exists(path):
            yield from ("--ro-bind", os.devnull, path)


def _pin_ancestors(state_dirs: Sequence[Path], roots: Sequence[Path]) -> Iterator[str]:
    """Each folder between a root and a state dir inside it, bound writable onto itself.

    A read-only bind holds what is under it, but not its name: with the workspace $HOME,
    `mv .config .old; mkdir -p .config/resident` would set the user's config aside and
    plant a new one. rename() refuses to move a mount point (EBUSY), so each folder on
    the way becomes one, outermost first (a later bind from the host would hide the
    mounts under it), and stays as writable as the rest of the workspace."""
    pinned: set[Path] = set()
    for state in sorted(state_dirs, key=lambda p: len(p.parts)):
        root = next(r for r in roots if r in state.parents)
        for folder in reversed(state.parents):
            if root in folder.parents and folder not in pinned and folder.is_dir():
                pinned.add(folder)
                yield from ("--bind", str(folder), str(folder))


def workspace_mounts(plan: MountPlan) -> Iterator[str]:
    """Scratch space, toolchains, the workspace and what lies read-only or masked on it."""
    yield from proc_mounts()
    yield from ("--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/dev/shm")
    if plan.home is not None and not _is_system(plan.home):
        yield from ("--tmpfs", str(plan.home))
    for path in _outermost([*plan.toolchains, *plan.read_only_paths]):
        if not _inside(path, [plan.workspace, *plan.extra_roots]):
            yield from ("--ro-bind-try", str(path), str(path))
    if plan.network:
        resolv = Path(os.path.realpath("/etc/resolv.conf"))
        if resolv.is_file() and not _is_system(resolv):
            yield from ("--ro-bind", str(resolv), str(resolv))
    roots = (plan.workspace, *plan.extra_roots)
    for root in roots:
        # Opened inside ~/.config/resident: all of it is Resident's, so none is writable.
        yield from _bind(root, writable=plan.writable and not _inside(root, plan.state_dirs))
    inside = [d for d in plan.state_dirs if any(root in d.parents for root in roots)]
    if plan.writable:
        yield from _pin_ancestors(inside, roots)
    protected = [*(plan.workspace / n for n in PROJECT_CONFIG), *inside]
    if not plan.git_writable:
        protected += git_dirs(plan.workspace)
    for path in protected:
        if os.path.lexists(path) and not path.is_symlink():
            yield from _bind(path, writable=False)
    for path in plan.masked:
        if path.is_dir():
            yield from ("--tmpfs", str(path), "--remount-ro", str(path))
        else:
            yield from ("--ro-bind", os.devnull, str(path))
