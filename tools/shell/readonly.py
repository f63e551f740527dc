"""Commands that only look: what read-only mode may run, and what the other modes run unasked.

Each entry is a program that cannot change files or run other programs,
given the option checks below (find without -exec or -delete, sort without
-o, git only with its inspecting subcommands, ...). Whatever is not
described here is not read-only. In the sandbox a command called read-only
runs unasked with a read-only workspace, so calling a writer read-only
makes it fail; calling a program runner read-only lets it run unasked.

GNU programs accept any unambiguous prefix of a long option (`sort --outp=x`
is `sort --output=x`), so long options are compared as possible
abbreviations (tools.shell.option_words); short options are read as clusters
(`-nro` holds `-o`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from tools.shell.option_words import names_any_long_option, short_letters
from tools.shell.readonly_git import git_operands, git_problem

# Programs that print facts about strings or the system and take no file operands.
PATH_FREE = frozenset(
    {"echo", "printf", "pwd", "true", "false", "whoami", "id", "uname", "date", "basename",
     "dirname", "which", "type", "hostname", "nproc", "test", "["}
)  # fmt: skip
# Programs that read the files named on their command line and nothing else.
FILE_READERS = frozenset(
    {"ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "stat", "file", "du", "df",
     "diff", "cmp", "cut", "tr", "nl", "od", "column", "md5sum", "sha1sum", "sha256sum",
     "sha512sum", "tac", "rev", "strings", "cd", "rg", "find", "tree", "sort", "uniq", "git",
     "realpath", "readlink"}
)  # fmt: skip

_FIND_FORBIDDEN = frozenset(
    {"-exec", "-execdir", "-ok", "-okdir", "-delete", "-fprint", "-fprint0", "-fprintf", "-fls"}
)
_HIDDEN_NAMES = "reads the names of the files to read from a file or its input"
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

Option = tuple[str | None, str | None]  # (option, value), or (None, operand)
_Check = Callable[[tuple[str, ...]], str | None]


def _walk(
    args: tuple[str, ...], valued: str = "", optional: str = "", long_valued: tuple[str, ...] = ()
) -> Iterator[Option]:
    """Options with their values, and operands, the way getopt_long reads them:
    options anywhere (it permutes), a cluster ends at a letter that takes a value,
    an abbreviated long option is named in full when it is one of `long_valued`."""
    index = 0
    operands_only = False
    while index < len(args):
        word = args[index]
        index += 1
        if operands_only or word == "-" or not word.startswith("-"):
            yield None, word
        elif word == "--":
            operands_only = True
        elif word.startswith("--"):
            name, equals, value = word.partition("=")
            full = names_any_long_option(name, long_valued)
            if full and not equals and index < len(args):
                value, index = args[index], index + 1
            yield full or name, value if (equals or full) else None
        else:
            letters = short_letters(word, valued + optional)
            for position, letter in enumerate(letters, start=2):
                if letter not in valued and letter not in optional:
                    yield "-" + letter, None
                    continue
                value = word[position:]
                if not value and letter in valued and index < len(args):
                    value, index = args[index], index + 1
                yield "-" + letter, value or None


def _forbidden(
    program: str, args: tuple[str, ...], reasons: dict[str, str], valued: str = ""
) -> str | None:
    """The first option of `args` that `reasons` names ('-o' or '--output', long
    ones also abbreviated), with its reason."""
    longs = tuple(o for o in reasons if o.startswith("--"))
    for word in args:
        if word == "--":
            return None
        long = names_any_long_option(word, longs)
        if long:
            return f"{program} {word} {reasons[long]}"
        for letter in short_letters(word, valued):
            if "-" + letter in reasons:
                return f"{program} -{letter} {reasons['-' + letter]}"
    return None


def _check_find(args: tuple[str, ...]) -> str | None:
    bad = next((a for a in args if a in _FIND_FORBIDDEN), None)
    if bad:
        return f"find {bad} runs commands or changes files"
    return f"find -files0-from {_HIDDEN_NAMES}" if "-files0-from" in args else None


def _forbids(program: str, reasons: dict[str, str], valued: str = "") -> _Check:
    return lambda args: _forbidden(program, args, reasons, valued)


_check_rg = _forbids(
    "rg",
    {
        "--pre": "runs a program on every file",
        "--search-zip": "runs decompression programs",
        "-z": "runs decompression programs",
        "--hostname-bin": "runs a program",
    },
    valued="ABCEMdefgjmrtT",
)
_check_sort = _forbids(
    "sort",
    {
        "--output": "writes a file",
        "-o": "writes a file",
        "--temporary-directory": "writes temporary files there",
        "-T": "writes temporary files there",
        "--compress-program": "runs a program",
        "--files0-from": _HIDDEN_NAMES,
    },
    valued="kotST",
)
# tree -R writes 00Tree.html into every directory (with -H); --fromfile reads a listing.
_check_tree = _forbids(
    "tree",
    {"-o": "writes a file", "-R": "writes files", "--fromfile": _HIDDEN_NAMES},
    valued="LPIHTo",
)
_check_file = _forbids(
    "file",
    {
        "-C": "writes a magic file",
        "--compile": "writes a magic file",
        "-f": _HIDDEN_NAMES,
        "--files-from": _HIDDEN_NAMES,
    },
    valued="efFmP",
)
_CHECKSUM = {"-c": _HIDDEN_NAMES, "--check": _HIDDEN_NAMES}
_FILES0 = {"--files0-from": _HIDDEN_NAMES}


def _check_uniq(args: tuple[str, ...]) -> str | None:
    walked = _walk(args, "fsw", long_valued=("--skip-fields", "--skip-chars", "--check-chars"))
    operands = [word for option, word in walked if option is None]
    return "uniq with two file operands writes the second" if len(operands) > 1 else None


_DATE_LONG = ("--date", "--file", "--reference", "--set")


def _check_date(args: tuple[str, ...]) -> str | None:
    for option, value in _walk(args, "dfrs", "I", _DATE_LONG):
        if option in ("-s", "--set"):
            return "date -s sets the clock"
        if option is None and value and not value.startswith("+"):
            return "date with an operand that is not a +FORMAT sets the clock"
    return None


def _date_paths(args: tuple[str, ...]) -> list[str]:
    """date -f FILE reads dates from FILE, date -r FILE reads its time."""
    paths = ("-f", "--file", "-r", "--reference")
    return [v for o, v in _walk(args, "dfrs", "I", _DATE_LONG) if o in paths and v]


def _check_hostname(args: tuple[str, ...]) -> str | None:
    for option, _value in _walk(args, "F", long_valued=("--file",)):
        if option is None or option in ("-F", "--file", "-b", "--boot"):
            return "hostname with a name, -F or -b sets the host name"
        if names_any_long_option(option, ("--boot",)):
            return "hostname --boot sets the host name"
    return None


def _check_printf(args: tuple[str, ...]) -> str | None:
    # `printf -v 'a[$(cmd)]'`: bash evaluates an array subscript, substitutions included.
    if args and args[0].startswith("-v"):
        return "printf -v assigns a variable, and a subscript in its name runs commands"
    return None


def _check_test(args: tuple[str, ...]) -> str | None:
    # `test -v 'a[$(cmd)]'` evaluates the subscript, substitutions included; a plain
    # variable name cannot do that.
    for index, word in enumerate(args):
        if word in ("-v", "-R") and index + 1 < len(args):
            if not _VARIABLE.fullmatch(args[index + 1]):
                return f"test {word} with an array subscript runs the commands in it"
    return None


_CHECKS: dict[str, _Check] = {
    "find": _check_find,
    "rg": _check_rg,
    "sort": _check_sort,
    "tree": _check_tree,
    "uniq": _check_uniq,
    "date": _check_date,
    "hostname": _check_hostname,
    "file": _check_file,
    "md5sum": _forbids("md5sum", _CHECKSUM),
    "sha1sum": _forbids("sha1sum", _CHECKSUM),
    "sha256sum": _forbids("sha256sum", _CHECKSUM),
    "sha512sum": _forbids("sha512sum", _CHECKSUM),
    "wc": _forbids("wc", _FILES0),
    "du": _forbids("du", _FILES0),
    "printf": _check_printf,
    "test": _check_test,
    "[": _check_test,
    "git": git_problem,
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
    if not argv:
        return []
    program, words = argv[0], argv[1:]
    if program == "date":
        return _date_paths(words)
    if program in PATH_FREE:
        return []
    if program == "git":
        words = tuple(git_operands(words))
    operands = []
    for word in words:
        if word.startswith("-") and "=" in word:
            operands.append(word.split("=", 1)[1])
        elif not word.startswith("-") and word not in (";", "+", "{}"):
            # binutils read more arguments from @FILE.
            operands.append(word[1:] if program == "strings" and word[:1] == "@" else word)
    return operands
