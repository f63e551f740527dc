"""Programs that run another program named in their arguments, and how to see past them.

`nice -n 5 git push` runs `git push`; a rule about `git push` must see it.
Each wrapper's options are listed the way its getopt string declares them
(which take a value, attached or in the next word), so the word where the
inner command starts is known, not guessed. An option not listed, a word
whose value comes from an expansion before the inner command, or an
abbreviation that names two options makes the peel fail with a problem:
the caller then cannot tell what runs, and says so.

Every wrapper here stops reading options at the first operand ('+' in its
getopt string, or a shell builtin), which is what makes this possible.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from tools.shell.option_words import resolve_long

Word = tuple[str, bool]  # a word and whether its value is unknown in advance (an expansion)
_NUMBER = re.compile(r"--?\d+")


@dataclass(frozen=True)
class Peel:
    """What one wrapper runs."""

    inner: tuple[Word, ...] | None  # the command it runs; None when it runs nothing
    assignments: tuple[str, ...] = ()  # NAME=value it puts in the inner command's environment
    notes: tuple[str, ...] = ()  # what it changes besides running `inner` (user, directory, ...)
    problem: str | None = None  # why what it runs cannot be told
    open_tail: bool = False  # `inner` receives more words, unknown in advance (xargs)


Finish = Callable[[dict[str, str | None], list[Word]], Peel]


@dataclass(frozen=True)
class WrapperSpec:
    flags: str = ""  # short options without a value
    valued: str = ""  # short options with a value, attached or the next word
    optional: str = ""  # short options whose value, if any, is attached (-i[REPL])
    long_flags: tuple[str, ...] = ()
    long_valued: tuple[str, ...] = ()  # --name=value or --name value
    long_optional: tuple[str, ...] = ()  # --name or --name=value
    operands: int = 0  # words between the options and the command (timeout's duration)
    note: str | None = None  # set when an allow rule for the inner command must not cover it
    option_notes: tuple[tuple[str, str], ...] = ()  # (option, what it changes)
    ends: frozenset[str] = frozenset()  # options with which it runs nothing it is given
    refuses: frozenset[str] = frozenset()  # options whose effect the checker does not follow
    assignments: bool = False  # NAME=value words may come before the command
    dash_is_option: bool = False  # env: a lone '-' means -i
    numeric: bool = False  # nice: '-5' and '--5' are adjustments
    lenient_long: bool = False  # any --name=value is an option (strace, ltrace)
    splits: frozenset[str] = frozenset()  # options whose value is split into more words (env -S)
    finish: Finish | None = None  # what follows the options, when it is not simply the command

    def longs(self) -> tuple[str, ...]:
        return self.long_flags + self.long_valued + self.long_optional


def _with_help(*names: str) -> tuple[str, ...]:
    return (*names, "--help", "--version")


_HELP = frozenset({"--help", "--version"})


def _finish_xargs(options: dict[str, str | None], rest: list[Word]) -> Peel:
    """xargs appends words read from its input, or puts them where the replace
    string stands (-I R, -i[R], --replace[=R]; '{}' by default)."""
    replace = next(
        (options[o] or "{}" for o in ("-I", "-i", "--replace") if o in options),
        None,
    )
    words = rest or [("echo", False)]
    if replace:
        words = [(w, unknown or replace in w) for w, unknown in words]
    return Peel(tuple(words), open_tail=replace is None)


def _finish_flock(options: dict[str, str | None], rest: list[Word]) -> Peel:
    """flock FILE -c SCRIPT runs the script with sh -c; flock FD runs nothing."""
    if rest and rest[0][0] in ("-c", "--command"):
        if len(rest) < 2:
            return Peel(None)
        return Peel((("sh", False), ("-c", False), rest[1]))
    return Peel(tuple(rest) or None)


def _finish_watch(options: dict[str, str | None], rest: list[Word]) -> Peel:
    """watch joins its words into a script for sh -c, unless -x (--exec) is given."""
    if not rest or "-x" in options or "--exec" in options:
        return Peel(tuple(rest) or None)
    script = " ".join(w for w, _ in rest)
    return Peel((("sh", False), ("-c", False), (script, any(u for _, u in rest))))


def _finish_privileged(options: dict[str, str | None], rest: list[Word]) -> Peel:
    """sudo -s / -i and doas -s without a command start a shell that reads its input."""
    if not rest and {"-s", "-i", "--shell", "--login"} & options.keys():
        return Peel(None, problem="it starts a shell that reads commands from its input")
    return Peel(tuple(rest) or None)


def _finish_command(options: dict[str, str | None], rest: list[Word]) -> Peel:
    # command -v / -V only say what a name is; nothing runs.
    if "-v" in options or "-V" in options:
        return Peel(None)
    return Peel(tuple(rest) or None)


_ENV_NOTE = (("-C", "env -C runs it in another directory"), ("--chdir", "env -C runs it in another directory"))  # fmt: skip
_TRACE_NOTE = "a tracer runs it (and may write its log to a file)"

WRAPPERS: dict[str, WrapperSpec] = {
    "env": WrapperSpec(
        flags="i0v", valued="uCS",
        long_flags=_with_help("--ignore-environment", "--null", "--debug", "--list-signal-handling"),
        long_valued=("--unset", "--chdir", "--split-string"),
        long_optional=("--default-signal", "--ignore-signal", "--block-signal"),
        option_notes=_ENV_NOTE, ends=_HELP, assignments=True, dash_is_option=True,
        splits=frozenset({"-S", "--split-string"}),
    ),
    "command": WrapperSpec(flags="pvV", finish=_finish_command),
    "builtin": WrapperSpec(),
    "exec": WrapperSpec(flags="cl", valued="a"),
    "nice": WrapperSpec(
        valued="n", long_valued=("--adjustment",), long_flags=_with_help(), ends=_HELP,
        numeric=True,
    ),
    "ionice": WrapperSpec(
        flags="thV", valued="cnpPu", long_flags=_with_help("--ignore"),
        long_valued=("--class", "--classdata", "--pid", "--pgid", "--uid"),
        ends=_HELP | {"-h", "-V"},
        refuses=frozenset({"-p", "-P", "-u", "--pid", "--pgid", "--uid"}),
    ),
    "timeout": WrapperSpec(
        flags="v", valued="ks", long_flags=_with_help("--foreground", "--preserve-status", "--verbose"),
        long_valued=("--kill-after", "--signal"), operands=1, ends=_HELP,
    ),
    "stdbuf": WrapperSpec(
        valued="ioe", long_valued=("--input", "--output", "--error"), long_flags=_with_help(),
        ends=_HELP,
    ),
    "nohup": WrapperSpec(long_flags=_with_help(), ends=_HELP),
    "time": WrapperSpec(
        flags="apqvV", valued="fo",
        long_flags=_with_help("--append", "--portability", "--quiet", "--verbose"),
        long_valued=("--format", "--output"),
        option_notes=(("-o", "time -o writes a file"), ("--output", "time -o writes a file")),
        ends=_HELP | {"-V"},
    ),
    "xargs": WrapperSpec(
        flags="0oprtx", valued="adEILnPs", optional="eil",
        long_flags=_with_help("--null", "--interactive", "--no-run-if-empty", "--verbose",
                              "--exit", "--open-tty", "--show-limits"),
        long_valued=("--arg-file", "--delimiter", "--max-args", "--max-procs", "--max-chars",
                     "--process-slot-var"),
        long_optional=("--eof", "--replace", "--max-lines"),
        note="xargs adds words read from its input", ends=_HELP, finish=_finish_xargs,
    ),
    "sudo": WrapperSpec(
        flags="AbEeHiKklnPSsVvBN", valued="CDgpRrTtUu", optional="h",
        long_flags=_with_help("--askpass", "--background", "--bell", "--edit", "--set-home",
                              "--login", "--remove-timestamp", "--reset-timestamp", "--list",
                              "--non-interactive", "--preserve-groups", "--stdin", "--shell",
                              "--validate"),
        long_valued=("--close-from", "--chdir", "--group", "--host", "--prompt", "--chroot",
                     "--role", "--type", "--command-timeout", "--other-user", "--user"),
        long_optional=("--preserve-env",),
        note="sudo runs it as another user", assignments=True, finish=_finish_privileged,
    ),
    "doas": WrapperSpec(
        flags="Lns", valued="aCu", note="doas runs it as another user",
        finish=_finish_privileged,
    ),
    "setsid": WrapperSpec(
        flags="cfw", long_flags=_with_help("--ctty", "--fork", "--wait"), ends=_HELP,
        note="setsid runs it in a new session, apart from the command's process group",
    ),
    "chrt": WrapperSpec(
        flags="abdfiorRvmpe", valued="TPD",
        long_flags=_with_help("--all-tasks", "--batch", "--deadline", "--fifo", "--idle",
                              "--other", "--rr", "--reset-on-fork", "--verbose", "--max",
                              "--pid", "--ext"),
        long_valued=("--sched-runtime", "--sched-period", "--sched-deadline"),
        operands=1, note="chrt changes its scheduling", ends=_HELP | {"-m", "--max"},
        refuses=frozenset({"-p", "--pid"}),
    ),
    "taskset": WrapperSpec(
        flags="apc", long_flags=_with_help("--all-tasks", "--pid", "--cpu-list"), operands=1,
        note="taskset pins it to CPUs", ends=_HELP, refuses=frozenset({"-p", "--pid"}),
    ),
    "flock": WrapperSpec(
        flags="sexnoFu", valued="wE",
        long_flags=_with_help("--shared", "--exclusive", "--unlock", "--nonblock", "--nb",
                              "--close", "--no-fork", "--verbose", "--fcntl"),
        long_valued=("--wait", "--timeout", "--conflict-exit-code"),
        operands=1, note="flock creates a lock file", ends=_HELP, finish=_finish_flock,
    ),
    "watch": WrapperSpec(
        flags="bcCegptwxr", valued="nqs", optional="d",
        long_flags=_with_help("--beep", "--color", "--no-color", "--errexit", "--chgexit",
                              "--precise", "--no-title", "--no-wrap", "--exec", "--no-rerun"),
        long_valued=("--interval", "--equexit", "--shotsdir"), long_optional=("--differences",),
        note="watch runs it over and over", ends=_HELP, finish=_finish_watch,
    ),
    "unbuffer": WrapperSpec(flags="p", note="unbuffer runs it under a pseudo-terminal"),
    "strace": WrapperSpec(
        flags="AcCdDfFhiknNqrtTvVwxyzZY", valued="abeEIoOpPsSuUX",
        long_flags=_with_help("--follow-forks", "--output-separately", "--summary-only",
                              "--summary", "--summary-wall-clock", "--syscall-times",
                              "--timestamps", "--relative-timestamps", "--absolute-timestamps",
                              "--quiet", "--decode-fds", "--decode-pids", "--daemonize",
                              "--kill-on-exit", "--seccomp-bpf", "--stack-trace", "--no-abbrev",
                              "--instruction-pointer", "--raw", "--verbose", "--secontext"),
        note=_TRACE_NOTE, ends=_HELP | {"-h", "-V"}, lenient_long=True,
    ),
    "ltrace": WrapperSpec(
        flags="bcCfhiLrStTV", valued="aADeFlnopsuwx", long_flags=_with_help("--demangle"),
        note=_TRACE_NOTE, ends=_HELP | {"-h", "-V"}, lenient_long=True,
    ),
}  # fmt: skip


class _Unclear(Exception):
    """Raised with the reason when a wrapper's words cannot be read for certain."""


def _parse_options(
    name: str, spec: WrapperSpec, words: list[Word]
) -> tuple[dict[str, str | None], list[Word], int]:
    """The options before the operands ({option: value}), the words (after any
    splitting) and the index of the first operand."""
    options: dict[str, str | None] = {}
    words = list(words)
    index = 1
    while index < len(words):
        word, unknown = words[index]
        if unknown:
            # Unquoted, it may split into options, operands and a command alike.
            raise _Unclear(f"a word given to {name} comes from an expansion")
        if not word.startswith("-"):
            break
        if word == "--":
            return options, words, index + 1
        if word == "-":
            if not spec.dash_is_option:
                break
            options["-i"] = None
            index += 1
            continue
        if spec.numeric and _NUMBER.fullmatch(word):
            options["-n"] = word.lstrip("-")
            index += 1
            continue
        reader = _long_option if word.startswith("--") else _short_options
        found, consumed = reader(name, spec, words, index)
        for option, value in found:
            options[option] = value
            if option in spec.splits and value is not None:
                try:
                    split = [(w, False) for w in shlex.split(value)]
                except ValueError as exc:
                    raise _Unclear(f"{name} {option} is given a string it cannot split") from exc
                words[index + consumed : index + consumed] = split
        index += consumed
    return options, words, index


def _value_after(name: str, option: str, words: list[Word], index: int) -> str | None:
    if index + 1 >= len(words):
        return None  # the program itself rejects the line
    value, unknown = words[index + 1]
    if unknown:
        raise _Unclear(f"the value of {name} {option} comes from an expansion")
    return value


def _long_option(
    name: str, spec: WrapperSpec, words: list[Word], index: int
) -> tuple[list[tuple[str, str | None]], int]:
    written, has_value, value = words[index][0].partition("=")
    option = resolve_long(written, spec.longs())
    if option is None:
        if spec.lenient_long and has_value:
            return [(written, value)], 1
        raise _Unclear(f"{name} is given an option the checker does not know ({written})")
    if option in spec.long_valued and not has_value:
        return [(option, _value_after(name, option, words, index))], 2
    if option in spec.long_flags and has_value:
        raise _Unclear(f"{name} {option} takes no value")
    return [(option, value if has_value else None)], 1


def _short_options(
    name: str, spec: WrapperSpec, words: list[Word], index: int
) -> tuple[list[tuple[str, str | None]], int]:
    word = words[index][0]
    found: list[tuple[str, str | None]] = []
    for position, letter in enumerate(word[1:], start=1):
        option = "-" + letter
        attached = word[position + 1 :]
        if letter in spec.valued:
            if attached:
                return [*found, (option, attached)], 1
            return [*found, (option, _value_after(name, option, words, index))], 2
        if letter in spec.optional:
            return [*found, (option, attached or None)], 1
        if letter not in spec.flags:
            raise _Unclear(f"{name} is given an option the checker does not know ({option})")
        found.append((option, None))
    return found, 1


def peel(name: str, words: list[Word]) -> Peel | None:
    """What the wrapper `name` (words[0] is how it was written) runs; None when
    `name` is not a wrapper."""
    spec = WRAPPERS.get(name)
    if spec is None:
        return None
    try:
        options, words, index = _parse_options(name, spec, words)
    except _Unclear as exc:
        return Peel(None, problem=str(exc))
    assignments: list[str] = []
    while spec.assignments and index < len(words):
        word, unknown = words[index]
        if unknown:
            return Peel(None, problem=f"a word given to {name} comes from an expansion")
        # env takes every word with '=' for an assignment, names that bash would
        # refuse included (`BASH_FUNC_ls%%=() { ...; }` exports a function).
        if "=" not in word:
            break
        assignments.append(word)
        index += 1
    if options.keys() & spec.refuses:
        option = next(iter(options.keys() & spec.refuses))
        return Peel(None, problem=f"the checker does not follow {name} {option}")
    if options.keys() & spec.ends:
        return Peel(None)
    for _ in range(spec.operands):
        if index >= len(words):
            return Peel(None)
        if words[index][1]:
            return Peel(None, problem=f"an operand of {name} comes from an expansion")
        index += 1
    notes = [spec.note] if spec.note else []
    notes += [text for option, text in spec.option_notes if option in options]
    rest = words[index:]
    done = spec.finish(options, rest) if spec.finish else Peel(tuple(rest) or None)
    return Peel(
        done.inner,
        assignments=tuple(assignments),
        notes=tuple(dict.fromkeys(notes + list(done.notes))),
        problem=done.problem,
        open_tail=done.open_tail,
    )
