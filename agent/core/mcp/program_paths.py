"""What a stdio server's program needs to run in the sandbox: its file, its interpreter, its
virtual environment.

The sandbox shows the system folders, the workspace and the toolchains on PATH; a server
installed elsewhere (`pip install mcp-server-time` into `~/venvs/time`, named by its full
path) would not even be found there. So, for the program an entry names, this works out:

- the program itself: its path, found on the PATH the server will see when it is a bare
  name, with every symlink followed (a venv's `bin/python` links to a base interpreter);
- the interpreter its `#!` line names (`#!/usr/bin/env python3` looked up on that PATH, and
  pip's `#!/bin/sh` + `'''exec' /long/path/python` form for long paths), and that one's, up
  to the kernel's depth;
- the virtual environment a program or interpreter lies in (the folder with `pyvenv.cfg`
  above its `bin/`), the base install that environment's `home =` names, and the install
  prefix of a Python interpreter (the folder holding `bin/python3.X` and `lib/python3.X`).

Only these become readable, never a folder a program merely sits in: a script in
`~/tools/` gets the file alone, not `~/tools/`. A folder is used only when it is a venv or
a Python install, checked on disk (a hostile entry cannot make one outside the workspace),
and never when it is `/`, the user's home or above it, `~/.local` or `~/.config` themselves
(their parent folders hold credentials) or anything inside `.ssh`, `.aws` and the like. A
program about to be made readable that is a secret-looking file (`~/.ssh/id_rsa`) or not
an executable file is refused outright. What the sandbox shows anyway (system folders, the
workspace, the toolchains and grants the caller names) is not mounted again.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from tools.sandbox.mounts import (
    HIDDEN_SYSTEM_PATHS,
    MAX_POINTER_FILE_BYTES,
    SYSTEM_DIRS,
    is_python_install,
    may_show_folder,
)
from tools.workspace.bounded_read import read_bounded
from tools.workspace.paths import SECRET_DIR_NAMES, is_secret_name

# The kernel follows at most this many `#!` interpreters in a row (BINPRM_MAX_RECURSION).
MAX_INTERPRETER_DEPTH = 4
# How much of a file is read to find its `#!` line, and pip's second line after it.
_HEAD_BYTES = 1024
_PYTHON_NAME = re.compile(r"(python|pypy)[0-9.]*")
_ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_BLANK = re.compile(r"[ \t]+")
_PIP_EXEC_PREFIX = "'''exec' "  # distlib's sh-then-python launcher for long interpreter paths


class ProgramRefused(Exception):
    """The program an entry names must not be made readable; the message says why."""


@dataclass(frozen=True)
class ProgramPaths:
    """What to run and what to show read-only for it.

    `command` is what the sandbox executes: the entry's own command, or the program's real
    path when the path it was named by would not exist inside the sandbox (a symlink
    outside every folder shown there). `read_only` holds real paths, files and folders."""

    command: str
    read_only: tuple[Path, ...] = ()


def program_paths(
    command: str,
    *,
    search_path: str,
    workspace: Path,
    home: Path | None,
    visible: tuple[Path, ...] = (),
) -> ProgramPaths:
    """The paths `command` needs in the sandbox. `search_path` is the PATH the server gets,
    `visible` what the sandbox already shows besides system folders and the workspace (the
    entry's `read` grants). A command that is not found gets nothing: starting it then fails
    with the usual "No such file or directory". Raises ProgramRefused."""
    located = _locate(command, search_path)
    if located is None:
        return ProgramPaths(command)
    finder = _Finder(search_path, Path(os.path.realpath(workspace)), home, visible)
    finder.program(located, depth=0)
    mounts = _outermost(finder.mounts)
    return ProgramPaths(_runnable(command, located, finder, mounts), tuple(mounts))


def _locate(command: str, search_path: str) -> Path | None:
    """The absolute path `command` names, as the sandbox's execvp would find it."""
    if "/" in command:
        # A relative path is relative to the workspace, which the sandbox shows anyway.
        return Path(os.path.normpath(command)) if os.path.isabs(command) else None
    # Relative PATH entries would be read from the agent's directory, not the server's.
    absolute = os.pathsep.join(e for e in search_path.split(os.pathsep) if os.path.isabs(e))
    found = shutil.which(command, path=absolute) if absolute else None
    return Path(os.path.normpath(found)) if found else None


def _runnable(command: str, located: Path, finder: _Finder, mounts: list[Path]) -> str:
    """The entry's command when the sandbox can reach the program that way, else a path to it
    that exists there: a venv's bin/python keeps its own path (Python finds its venv from
    it), only a link outside every shown folder is replaced by what it points to."""
    if finder.shown_at(located, mounts):
        return command
    dir_resolved = Path(os.path.realpath(located.parent)) / located.name
    if finder.shown_at(dir_resolved, mounts):
        return str(dir_resolved)
    real = os.path.realpath(located)
    return real if finder.shown_at(Path(real), mounts) else command


def _outermost(paths: list[Path]) -> list[Path]:
    kept: list[Path] = []
    for path in sorted(dict.fromkeys(paths), key=lambda p: len(p.parts)):
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def _is_system(path: Path) -> bool:
    """Inside a folder every sandbox shows as it is on the host."""
    if len(path.parts) < 2 or path.parts[1] not in SYSTEM_DIRS:
        return False
    return not any(path == Path(h) or Path(h) in path.parents for h in HIDDEN_SYSTEM_PATHS)


class _Finder:
    def __init__(
        self, search_path: str, workspace: Path, home: Path | None, visible: tuple[Path, ...]
    ) -> None:
        self.search_path = search_path
        self.workspace = workspace
        self.home = Path(os.path.realpath(home)) if home is not None else None
        self.visible = tuple(Path(os.path.realpath(p)) for p in visible)
        self.mounts: list[Path] = []
        self._seen: set[Path] = set()

    def shown(self, real: Path) -> bool:
        """Whether the sandbox shows `real` (a resolved path) without a mount of ours."""
        roots = (self.workspace, *self.visible)
        return _is_system(real) or any(real == r or r in real.parents for r in roots)

    def shown_at(self, path: Path, mounts: list[Path]) -> bool:
        """Whether `path`, as written, leads to the program inside the sandbox: its folder
        has no symlink in it and lies in something shown (a link inside a mounted venv is
        kept as it is, and resolves inside the sandbox as on the host)."""
        parent = path.parent
        if Path(os.path.realpath(parent)) != parent:
            return _is_system(path)  # /bin -> usr/bin: the sandbox keeps those links
        if self.shown(path):
            return True
        return any(path == m or m in path.parents for m in mounts)

    def program(self, located: Path, depth: int) -> None:
        """`located` (absolute, as named) and what it needs, into self.mounts."""
        real = Path(os.path.realpath(located))
        if located in self._seen or depth > MAX_INTERPRETER_DEPTH:
            return
        self._seen.add(located)
        try:
            regular = stat.S_ISREG(real.stat().st_mode)
        except OSError:
            return  # missing: starting it fails and says so
        if not self.shown(real):  # about to become readable: it must be a program
            for path in (located, real):
                reason = _secret_reason(path)
                if reason:
                    raise ProgramRefused(f"{located} is not a program to run: {reason}")
            if not regular or not os.access(real, os.X_OK):
                raise ProgramRefused(f"{located} is not an executable file")
        if not regular:
            return
        environments = [self._venv_of(path) for path in (located, real)]
        folders = [f for f in (*environments, self._python_prefix(real)) if f is not None]
        for folder in folders:
            self._add(folder)
        if not folders:
            self._add(real)  # the file alone, never the folder it sits in
        for interpreter in self._interpreters(real):
            self.program(interpreter, depth + 1)

    def _add(self, path: Path) -> None:
        if not self.shown(path):
            self.mounts.append(path)

    def _venv_of(self, program: Path) -> Path | None:
        """The virtual environment `program` is in (its bin/ beside pyvenv.cfg), real path;
        its base install is added on the way."""
        bin_dir = Path(os.path.realpath(program.parent))
        root = bin_dir.parent
        config = root / "pyvenv.cfg"
        if bin_dir.name != "bin" or config.is_symlink() or not config.is_file():
            return None
        if not may_show_folder(root, self.home):
            return None
        base = self._venv_home(config)
        if base is not None:
            self._add(base)
        return root

    def _venv_home(self, config: Path) -> Path | None:
        """The install `home =` in pyvenv.cfg names, when it really is a Python install."""
        try:
            head = read_bounded(config, MAX_POINTER_FILE_BYTES, truncate=True)
            lines = head.decode("utf-8", errors="replace").splitlines()
        except OSError:
            return None
        for line in lines:
            key, _, value = line.partition("=")
            if key.strip() == "home" and os.path.isabs(value.strip()):
                bin_dir = Path(os.path.realpath(value.strip()))
                prefix = bin_dir.parent if bin_dir.name == "bin" else bin_dir
                return prefix if is_python_install(prefix, self.home) else None
        return None

    def _python_prefix(self, real: Path) -> Path | None:
        """The install a Python interpreter belongs to (`PREFIX/bin/python3.X`)."""
        if not _PYTHON_NAME.fullmatch(real.name) or real.parent.name != "bin":
            return None
        prefix = real.parent.parent
        return prefix if is_python_install(prefix, self.home) else None

    def _interpreters(self, real: Path) -> list[Path]:
        """The programs the `#!` line of `real` runs, as absolute paths: the interpreter,
        and for `env` or pip's sh launcher the program those start."""
        try:
            head = read_bounded(real, _HEAD_BYTES, truncate=True)  # a FIFO must not block
        except OSError:
            return []
        if not head.startswith(b"#!"):
            return []
        lines = os.fsdecode(head).split("\n")
        # The kernel splits the line once, at the first blank: interpreter and one argument.
        interpreter, _, argument = _BLANK.sub(" ", lines[0][2:].strip(), count=1).partition(" ")
        if not os.path.isabs(interpreter):
            return []  # relative: found from the workspace, which the sandbox shows
        found = [Path(os.path.normpath(interpreter))]
        name = os.path.basename(interpreter)
        if name == "env" and argument.strip():
            program = _env_program(argument.strip())
            target = _locate(program, self.search_path) if program else None
            found += [target] if target is not None else []
        elif name == "sh" and len(lines) > 1:
            target = _pip_launcher_target(lines[1])
            found += [target] if target is not None else []
        return found


def _secret_reason(program: Path) -> str | None:
    """Why a program's file probably holds secrets: a name like id_rsa or .env, or a
    credentials folder above it (a program may well be called `gcloud` itself)."""
    for part in program.parts[:-1]:
        if part in SECRET_DIR_NAMES:
            return f"it is inside a {part} directory, which usually holds credentials"
    if is_secret_name(program.name):
        return f"files named like {program.name} usually hold secrets"
    return None


def _pip_launcher_target(line: str) -> Path | None:
    """The interpreter of pip's `'''exec' "/long/path/python" "$0" "$@"` line."""
    if not line.startswith(_PIP_EXEC_PREFIX):
        return None
    try:
        words = shlex.split(line[len(_PIP_EXEC_PREFIX) :])
    except ValueError:
        return None
    return Path(os.path.normpath(words[0])) if words and os.path.isabs(words[0]) else None


def _env_program(argument: str) -> str | None:
    """The program `#!/usr/bin/env ARGUMENT` runs. The kernel passes ARGUMENT as one word,
    so only `env -S` splits it."""
    if not argument.startswith("-"):
        return argument
    if not (argument.startswith("-S") or argument.startswith("--split-string")):
        return None
    rest = argument.removeprefix("--split-string").removeprefix("-S").lstrip("= ")
    try:
        words = shlex.split(rest)
    except ValueError:
        return None
    skip_next = False
    for word in words:
        if skip_next:
            skip_next = False
        elif word in ("-u", "--unset", "-C", "--chdir"):
            skip_next = True
        elif word.startswith("-") or _ENV_ASSIGNMENT.match(word):
            continue
        else:
            return word
    return None
