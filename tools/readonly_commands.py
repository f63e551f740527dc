"""Commands that only look: what read-only mode may run, and what the other modes run unasked.

Each entry is a program that cannot change files or run other programs,
given the option checks below (find without -exec or -delete, sort without
-o, git only with its inspecting subcommands, ...). Whatever is not
described here is not read-only.
"""

from __future__ import annotations

from collections.abc import Callable

# Programs that print facts about strings or the system and take no file operands.
PATH_FREE = frozenset(
    {"echo", "printf", "pwd", "true", "false", "whoami", "id", "uname", "date", "basename",
     "dirname", "which", "type", "hostname", "nproc", "realpath", "readlink", "test", "["}
)  # fmt: skip
# Programs that read the files named on their command line and nothing else.
FILE_READERS = frozenset(
    {"ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "stat", "file", "du", "df",
     "diff", "cmp", "cut", "tr", "nl", "od", "column", "md5sum", "sha1sum", "sha256sum",
     "sha512sum", "tac", "rev", "strings", "cd", "rg", "find", "tree", "sort", "uniq", "git"}
)  # fmt: skip

GIT_INSPECTING = frozenset(
    {"status", "diff", "log", "show", "blame", "ls-files", "ls-tree", "rev-parse", "describe",
     "shortlog", "grep", "cat-file", "rev-list", "reflog", "branch", "tag", "remote", "stash"}
)  # fmt: skip
GIT_FORBIDDEN_OPTIONS = ("--output", "--ext-diff", "-O", "--open-files-in-pager", "--exec")
_FIND_FORBIDDEN = frozenset(
    {"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"}
)


def _short_cluster_has(word: str, letter: str) -> bool:
    return word.startswith("-") and not word.startswith("--") and letter in word[1:]


def _positionals(args: tuple[str, ...]) -> list[str]:
    return [a for a in args if not a.startswith("-") or a == "-"]


def _check_find(args: tuple[str, ...]) -> str | None:
    bad = next((a for a in args if a in _FIND_FORBIDDEN), None)
    return f"find {bad} runs commands or changes files" if bad else None


def _check_rg(args: tuple[str, ...]) -> str | None:
    if any(a == "--pre" or a.startswith("--pre=") for a in args):
        return "rg --pre runs a program on every file"
    return None


def _check_sort(args: tuple[str, ...]) -> str | None:
    for word in args:
        if word.startswith(("--output", "--compress-program")) or _short_cluster_has(word, "o"):
            return "sort -o/--output writes a file"
    return None


def _check_tree(args: tuple[str, ...]) -> str | None:
    return "tree -o writes a file" if any(_short_cluster_has(a, "o") for a in args) else None


def _check_uniq(args: tuple[str, ...]) -> str | None:
    return "uniq with two file operands writes the second" if len(_positionals(args)) > 1 else None


def _check_date(args: tuple[str, ...]) -> str | None:
    if any(a.startswith("--set") or _short_cluster_has(a, "s") for a in args):
        return "date -s sets the clock"
    return None


def _check_file(args: tuple[str, ...]) -> str | None:
    return "file -C writes a magic file" if any(_short_cluster_has(a, "C") for a in args) else None


def _check_git(args: tuple[str, ...]) -> str | None:
    rest = list(args)
    while rest and rest[0] in ("--no-pager", "--no-optional-locks"):
        rest.pop(0)
    if not rest:
        return None
    sub, options = rest[0], rest[1:]
    if sub.startswith("-"):
        return f"git {sub} before the subcommand can change what git runs"
    if sub not in GIT_INSPECTING:
        return f"git {sub} is not an inspecting git command"
    for option in options:
        if option.startswith(GIT_FORBIDDEN_OPTIONS):
            return f"git {sub} {option} writes files or runs programs"
    positional = _positionals(tuple(options))
    if sub in ("branch", "tag") and positional:
        return f"git {sub} with names creates or changes refs"
    if sub in ("branch", "tag") and any(
        o in ("-d", "-D", "-m", "-M", "-c", "-C", "-f", "--delete", "--move", "--force", "-a", "-s")
        and not (sub == "branch" and o == "-a")
        for o in options
    ):
        return f"git {sub} with those options changes refs"
    if sub == "remote" and positional and positional[0] not in ("show", "get-url"):
        return f"git remote {positional[0]} changes the configuration"
    if sub == "stash" and (not positional or positional[0] not in ("list", "show")):
        return "git stash changes the work tree"
    if sub == "reflog" and positional and positional[0] not in ("show",):
        return f"git reflog {positional[0]} changes the reflog"
    return None


_CHECKS: dict[str, Callable[[tuple[str, ...]], str | None]] = {
    "find": _check_find,
    "rg": _check_rg,
    "sort": _check_sort,
    "tree": _check_tree,
    "uniq": _check_uniq,
    "date": _check_date,
    "file": _check_file,
    "git": _check_git,
}


def read_only_problem(argv: tuple[str, ...]) -> str | None:
    """Why this simple command is not read-only, or None if it only reads."""
    if not argv:
        return None
    program = argv[0]
    if program not in PATH_FREE and program not in FILE_READERS:
        return f"{program} is not on the read-only command list"
    check = _CHECKS.get(program)
    return check(argv[1:]) if check else None


def path_operands(argv: tuple[str, ...]) -> list[str]:
    """Words of a read-only command that may name files (checked against the workspace).

    Errs towards treating words as paths: a grep pattern like '/etc' then
    needs approval, which is the safe mistake to make.
    """
    if not argv or argv[0] in PATH_FREE:
        return []
    words = list(argv[1:])
    if argv[0] == "git" and words:
        while words and words[0].startswith("--no-"):
            words.pop(0)
        words = words[1:]  # the subcommand
    operands = []
    for word in words:
        if word.startswith("-") and "=" in word:
            operands.append(word.split("=", 1)[1])
        elif not word.startswith("-") and word not in (";", "+", "{}"):
            operands.append(word)
    return operands
