"""Which git command lines only look: the git part of the read-only command list.

A git command is read-only when its subcommand only inspects the repository
and none of its options writes a file (`--output`), runs a program
(`--ext-diff`, `--textconv`, `--open-files-in-pager`, gpg for signatures),
touches the network (`remote show`, `fetch`, `ls-remote`) or rewrites
`.git/config` (`branch --set-upstream-to`, `config`). git's parse-options
accepts abbreviated long options, so every long option is compared as a
possible abbreviation (tools.shell.option_words).
"""

from __future__ import annotations

from tools.shell.option_words import has_short, names_any_long_option

GIT_INSPECTING = frozenset(
    {"status", "diff", "log", "show", "blame", "ls-files", "ls-tree", "rev-parse", "describe",
     "shortlog", "grep", "cat-file", "rev-list", "reflog", "branch", "tag", "remote", "stash"}
)  # fmt: skip
# Global options that change neither the repository, the configuration nor what
# git runs. The others (-c, -C, --git-dir, --exec-path, ...) are not read-only.
GIT_SAFE_GLOBALS = frozenset(
    {"--no-pager", "-P", "--no-optional-locks", "--no-replace-objects", "--no-advice",
     "--literal-pathspecs", "--glob-pathspecs", "--noglob-pathspecs", "--icase-pathspecs"}
)  # fmt: skip
# Options that write files or run programs, for every inspecting subcommand.
GIT_FORBIDDEN_LONG = (
    "--output",  # diff, log, show: writes the output to a file
    "--ext-diff",  # runs diff.external or a diff driver's command
    "--textconv",  # runs textconv drivers from the configuration
    "--filters",  # cat-file: runs smudge and clean filters
    "--open-files-in-pager",  # grep: runs a pager command given on the line
    "--show-signature",  # log, show: runs gpg
    "--exec",
)
# Real options that are prefixes of a forbidden one: in full they mean themselves.
_GIT_EXACT = ("--text", "--filter")
_GREP_VALUED = "efABCm"  # git grep's short options that take a value (-O's is optional)

# What `git branch` and `git tag` may be given when they only list (tag's -v verifies
# with gpg, so the two lists differ).
_LIST_FLAGS = {
    "branch": frozenset(
        {"-a", "--all", "-r", "--remotes", "-l", "--list", "-v", "-vv", "--verbose", "-q",
         "--quiet", "--color", "--no-color", "--column", "--no-column", "--abbrev", "--no-abbrev",
         "--show-current", "-i", "--ignore-case", "--omit-empty"}
    ),
    "tag": frozenset(
        {"-l", "--list", "-n", "--color", "--no-color", "--column", "--no-column", "-i",
         "--ignore-case", "--omit-empty"}
    ),
}  # fmt: skip
_LIST_VALUED = frozenset(
    {"--contains", "--no-contains", "--merged", "--no-merged", "--points-at", "--sort", "--format"}
)
_REMOTE_READS = frozenset({"-v", "--verbose"})
_GET_URL_FLAGS = frozenset({"--push", "--all"})


def split_git(args: tuple[str, ...]) -> tuple[list[str], str | None, list[str]]:
    """(global options, subcommand, its arguments) of `git ARGS`."""
    rest = list(args)
    globals_ = []
    while rest and rest[0].startswith("-"):
        globals_.append(rest.pop(0))
    if not rest:
        return globals_, None, []
    return globals_, rest[0], rest[1:]


def git_problem(args: tuple[str, ...]) -> str | None:
    """Why `git ARGS` is not read-only, or None when it only inspects."""
    globals_, sub, options = split_git(args)
    unsafe = next((g for g in globals_ if g not in GIT_SAFE_GLOBALS), None)
    if unsafe:
        return f"git {unsafe} before the subcommand can change what git runs"
    if sub is None:
        return None
    if sub not in GIT_INSPECTING:
        return f"git {sub} is not an inspecting git command"
    for option in options:
        forbidden = names_any_long_option(option, GIT_FORBIDDEN_LONG, exact=_GIT_EXACT)
        if forbidden:
            return f"git {sub} {option} ({forbidden}) writes files or runs programs"
        if option.startswith("-O") or (sub == "grep" and has_short(option, "O", _GREP_VALUED)):
            return f"git {sub} {option} runs a pager command or reads an order file"
        if "%G" in option or "%(signature" in option:
            return f"git {sub} {option} runs gpg to check signatures"
    check = _SUBCOMMAND_CHECKS.get(sub)
    return check(options) if check else None


def _listing_problem(sub: str, options: list[str]) -> str | None:
    """`git branch` and `git tag` only list when every option is a listing one; names
    are patterns only with --list, otherwise they create refs."""
    positional = []
    listing = False
    index = 0
    while index < len(options):
        word = options[index]
        name = word.split("=", 1)[0]
        if name in _LIST_VALUED:
            index += 1 if "=" in word else 2
            continue
        if word in ("-l", "--list"):
            listing = True
        elif sub == "tag" and word.startswith("-n") and word[2:].isdigit():
            pass  # tag -n[NUM] prints annotation lines
        elif word.startswith("-") and name not in _LIST_FLAGS[sub]:
            return f"git {sub} {word} does more than list (refs, configuration or gpg)"
        elif not word.startswith("-"):
            positional.append(word)
        index += 1
    if positional and not listing:
        return f"git {sub} with names creates or changes refs"
    return None


def _branch_problem(options: list[str]) -> str | None:
    return _listing_problem("branch", options)


def _tag_problem(options: list[str]) -> str | None:
    return _listing_problem("tag", options)


def _remote_problem(options: list[str]) -> str | None:
    """Only `git remote [-v]` and `git remote get-url`: `remote show` contacts the remote,
    `remote update` fetches, the rest change the configuration."""
    words = [o for o in options if o not in _REMOTE_READS]
    if not words:
        return None
    if words[0] == "get-url" and all(not w.startswith("-") or w in _GET_URL_FLAGS for w in words):
        return None
    return f"git remote {words[0]} contacts the remote or changes the configuration"


def _stash_problem(options: list[str]) -> str | None:
    positional = [o for o in options if not o.startswith("-")]
    if not positional or positional[0] not in ("list", "show"):
        return "git stash changes the work tree"
    return None


def _reflog_problem(options: list[str]) -> str | None:
    positional = [o for o in options if not o.startswith("-")]
    if not positional or positional[0] in ("show", "list", "exists"):
        return None
    first = positional[0]
    if first == "HEAD" or any(c in first for c in "@~^/"):
        return None  # `git reflog REF` is `git reflog show REF`
    return f"git reflog {first} may change the reflog"


_SUBCOMMAND_CHECKS = {
    "branch": _branch_problem,
    "tag": _tag_problem,
    "remote": _remote_problem,
    "stash": _stash_problem,
    "reflog": _reflog_problem,
}


def git_operands(args: tuple[str, ...]) -> list[str]:
    """The words after the global options and the subcommand (they may name files)."""
    _, sub, options = split_git(args)
    return options if sub is not None else []
