"""What a person trusts when they trust a repository's hooks or MCP servers: everything it runs.

A repository's `.resident/hooks.json` says `./scripts/guard.sh`; its
`.resident/mcp.json` says `python tools/server.py`. Trusting the config
alone would leave the script free to change afterwards (by the model, a
`git pull`, anyone), and the next run would execute what nobody read. So
trust covers the config's bytes and the bytes of every file in the
workspace its command lines name, and one digest stands for all of it
(`Coverage.digest`). Change any of them and the digest changes: trust is
gone and the person is asked again.

Which files a command names (`named_files`): each word of the command line
(shell words for a hook; the argv and env values for a server) that is, or
resolves to, a file inside the workspace; a word that looks like a path
(has a `/`, or a script's suffix) and names nothing yet is recorded as
absent, so creating it later counts as a change too; `python -m pkg.mod`
names `pkg/mod.py` (or `pkg/mod/__main__.py`). Targets of output
redirections are data, not code, and are left out (a hook that appends to
its own log would otherwise lose its trust on its first run). Files a
named script itself sources or imports are not followed: name them in the
command, or keep them outside the workspace, where the model cannot write.

With no file named, the digest is the config's own sha256, so records made
before scripts were covered still hold for hooks that name none.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

MAX_HASHED_BYTES = 256 * 1024 * 1024  # past this a file counts by size and time, not bytes
SCRIPT_SUFFIXES = (
    ".sh", ".bash", ".zsh", ".py", ".js", ".mjs", ".cjs", ".ts", ".rb", ".pl", ".php", ".lua",
)  # fmt: skip
_CHUNK = 1 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)
ABSENT = "absent"


@dataclass(frozen=True)
class Coverage:
    """One trust decision's subject: the config's digest and the files it names."""

    config_digest: str
    files: Mapping[str, str] = field(default_factory=dict)  # workspace-relative -> state

    @property
    def digest(self) -> str:
        if not self.files:
            return self.config_digest
        manifest = hashlib.sha256(b"resident-trust-v2\0" + self.config_digest.encode())
        for rel in sorted(self.files):
            manifest.update(f"\0{rel}\0{self.files[rel]}".encode())
        return manifest.hexdigest()

    def changed_since(self, trusted: Mapping[str, str] | None) -> list[str]:
        """The named files whose content differs from what was trusted (all of them when
        the record knows none), for a message."""
        if trusted is None:
            return sorted(self.files)
        names = set(self.files) | set(trusted)
        return sorted(n for n in names if self.files.get(n) != trusted.get(n))


def shell_words(command: str) -> list[str]:
    """A command line's words, operators apart, and output-redirection targets dropped."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""  # `#` inside a word is literal in sh; a stray one must not hide words
    try:
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: sh would refuse it too; judge the raw words
        tokens = command.split()
    words: list[str] = []
    skip_next = False
    for token in tokens:
        if skip_next:
            skip_next = False
            continue
        if token and set(token) <= set("();<>|&"):
            skip_next = ">" in token and not token.endswith("&")  # `> log`, not `2>&1`
            continue
        words.append(token)
    return words


def _module_candidates(module: str) -> list[str]:
    base = module.replace(".", "/")
    return [f"{base}.py", f"{base}/__main__.py", f"{base}/__init__.py"]


def _inside(workspace: Path, word: str) -> PurePosixPath | None:
    """`word` as a workspace-relative path when it resolves strictly inside the workspace."""
    if not word or "\x00" in word or word.startswith("~") or any(c in word for c in "$`*?["):
        return None
    joined = word if os.path.isabs(word) else os.path.join(workspace, word)
    real = Path(os.path.realpath(joined))
    if workspace not in real.parents:
        return None
    return PurePosixPath(real.relative_to(workspace).as_posix())


def named_files(words: Iterable[str], workspace: Path) -> list[str]:
    """The files inside `workspace` (a real path) that `words` name, workspace-relative."""
    found: set[str] = set()
    after_m = False
    for word in words:
        if after_m:
            after_m = False
            candidates = _module_candidates(word)
            existing = [c for c in candidates if (workspace / c).is_file()]
            found.update(existing or candidates[:1])
            continue
        if word == "-m":
            after_m = True
            continue
        if word.startswith("-"):
            word = word.partition("=")[2]  # --config=tools/x.py names a file; -v names none
        rel = _inside(workspace, word)
        if rel is None:
            continue
        target = workspace / rel
        if target.is_dir():
            continue
        looks_like_path = "/" in word or word.endswith(SCRIPT_SUFFIXES)
        if os.path.lexists(target) or looks_like_path:
            found.add(rel.as_posix())
    return sorted(found)


def file_state(path: Path) -> str:
    """What a named file holds, as one comparable string: its sha256, or why not."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        return ABSENT
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    if not stat.S_ISREG(before.st_mode):  # a FIFO or device is never opened
        return f"not a regular file (mode {stat.filemode(before.st_mode)})"
    if before.st_size > MAX_HASHED_BYTES:
        return f"large: {before.st_size} bytes, modified {before.st_mtime_ns}"
    digest = hashlib.sha256()
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        os.set_blocking(fd, True)
        read = 0
        while read <= MAX_HASHED_BYTES and (chunk := os.read(fd, _CHUNK)):
            digest.update(chunk)
            read += len(chunk)
    except OSError as err:
        return f"unreadable ({err.strerror or err})"
    finally:
        os.close(fd)
    return digest.hexdigest()


def cover(config_digest: str, words: Iterable[str], workspace: Path) -> Coverage:
    """The coverage of a config whose command lines hold `words`, as the files are now."""
    root = Path(os.path.realpath(workspace))
    files = {rel: file_state(root / rel) for rel in named_files(words, root)}
    return Coverage(config_digest, files)


def recheck(coverage: Coverage, workspace: Path) -> list[str]:
    """The covered files that changed since `coverage` was taken (for a running session)."""
    root = Path(os.path.realpath(workspace))
    return [rel for rel, was in sorted(coverage.files.items()) if file_state(root / rel) != was]
