"""What a shell command line would actually run, as far as a parser can tell.

bashlex parses the line the way bash would; the analysis lists every simple
command in it (inside lists, pipelines, loops, functions, substitutions and
`sh -c` scripts), every redirect, and every reason it cannot see the whole
picture: substitutions, variable expansion, scripts fed to a shell on
stdin. A permission check that wants "is this only `ls`?" must find one
simple command, `ls`, and nothing it cannot see.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import bashlex
import bashlex.errors

from tools.shell.normalize import Layer, every_layer

SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "mksh", "ash", "fish", "busybox"})
WRITE_REDIRECTS = frozenset({">", ">>", ">|", "&>", "&>>", "<>", ">&"})
READ_REDIRECTS = frozenset({"<"})
HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
MAX_NESTING = 3
_DIRECTORY_TILDE = re.compile(r"~[+-]\d*|~\d+")
# The `time` keyword where a command starts (bashlex does not implement it).
_TIME_KEYWORD = re.compile(
    r"(^|[;&|(){}!\n]|\b(?:then|do|else|if|elif|while|until)\b)(\s*)(time(?:\s+-p)?)(?=\s|$)"
)


@dataclass(frozen=True)
class Redirect:
    operator: str
    target: str | None  # None when duplicating a descriptor (2>&1)

    @property
    def writes_file(self) -> bool:
        return (
            self.operator in WRITE_REDIRECTS
            and self.target is not None
            and self.target not in HARMLESS_TARGETS
        )

    @property
    def reads_file(self) -> bool:
        return self.operator in READ_REDIRECTS and self.target is not None


@dataclass(frozen=True)
class SimpleCommand:
    argv: tuple[str, ...]
    assignments: tuple[str, ...] = ()
    redirects: tuple[Redirect, ...] = ()
    # Indexes of argv words whose value depends on expansion ($VAR, ${...}, $'...').
    expanding_words: frozenset[int] = frozenset()
    expands: bool = False  # anything in the command (argv, assignment, redirect) expands

    @property
    def program(self) -> str | None:
        return self.argv[0] if self.argv else None


@dataclass
class CommandAnalysis:
    source: str
    commands: list[SimpleCommand] = field(default_factory=list)
    error: str | None = None
    substitutions: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    background: bool = False

    @property
    def parsed(self) -> bool:
        return self.error is None

    @property
    def write_targets(self) -> list[str]:
        return [r.target for c in self.commands for r in c.redirects if r.writes_file and r.target]

    def visibility_problem(self) -> str | None:
        """Why the commands listed may not be all that runs, or None."""
        if self.error:
            return f"the command could not be parsed ({self.error})"
        if self.substitutions:
            return f"it uses {self.substitutions[0]}, which runs a command to build its arguments"
        if self.opaque:
            return self.opaque[0]
        return None


def _basename(word: str) -> str:
    return os.path.basename(word) if "/" in word else word


class _Collector:
    def __init__(self, analysis: CommandAnalysis, depth: int) -> None:
        self.analysis = analysis
        self.depth = depth
        self._seen: set[int] = set()

    def visit(self, node) -> None:
        if id(node) in self._seen:
            return
        self._seen.add(id(node))
        kind = node.kind
        if kind == "command":
            self._command(node)
        elif kind == "operator":
            if node.op == "&":
                self.analysis.background = True
        elif kind in ("pipe", "reservedword", "tilde"):
            pass
        elif kind == "word":
            self._word(node)
        elif kind == "redirect":
            self._redirect(node)
        elif kind in ("commandsubstitution", "processsubstitution"):
            self._substitution(node)
        elif kind == "parameter":
            pass  # handled by the word that contains it
        elif kind in ("list", "pipeline", "compound", "if", "for", "while", "until", "function"):
            for child in _children(node):
                self.visit(child)
        else:
            self.analysis.opaque.append(f"it uses shell syntax the checker does not know ({kind})")

    def _word(self, node) -> bool:
        """Visit a word's parts; True when its value depends on an expansion."""
        expands = False
        for part in getattr(node, "parts", None) or []:
            if part.kind == "parameter":
                expands = True
            elif part.kind in ("commandsubstitution", "processsubstitution"):
                expands = True
                self._substitution(part)
            elif part.kind == "tilde":
                # ~+ is $PWD, ~- $OLDPWD, ~N a directory-stack entry: a path check
                # would take `~+/../x` for a directory named '~+'.
                expands |= _DIRECTORY_TILDE.fullmatch(part.value) is not None
            else:
                self.visit(part)
        return expands

    def _substitution(self, node) -> None:
        start = node.pos[0]
        text = self.analysis.source[start : start + 2]
        if text.startswith("`"):
            label = "backtick command substitution"
        elif text in ("<(", ">("):
            label = "process substitution"
        else:
            label = "command substitution $(...)"
        self.analysis.substitutions.append(label)
        self.visit(node.command)

    def _redirect(self, node) -> Redirect:
        output = node.output
        if isinstance(output, int) or output is None:
            return Redirect(node.type, None)
        expands = self._word(output)
        heredoc = getattr(node, "heredoc", None)
        if heredoc is not None:
            body = heredoc.value or ""
            if "$(" in body or "`" in body:
                self.analysis.substitutions.append("command substitution in a here-document")
            if "$" in body:
                self.analysis.opaque.append("its here-document expands variables")
            return Redirect(node.type, None)
        if node.type == "<<<":
            return Redirect(node.type, None)  # a here-string is data, not a file
        if expands:
            self.analysis.opaque.append("a redirect target depends on a variable")
        return Redirect(node.type, output.word)

    def _command(self, node) -> None:
        argv: list[str] = []
        assignments: list[str] = []
        redirects: list[Redirect] = []
        expanding: set[int] = set()
        expands = False
        for part in node.parts:
            if part.kind == "word":
                if self._word(part):
                    expanding.add(len(argv))
                    expands = True
                argv.append(part.word)
            elif part.kind == "assignment":
                expands |= self._word(part)
                assignments.append(part.word)
            elif part.kind == "redirect":
                redirects.append(self._redirect(part))
            else:
                self.visit(part)
        command = SimpleCommand(
            argv=tuple(argv),
            assignments=tuple(assignments),
            redirects=tuple(redirects),
            expanding_words=frozenset(expanding),
            expands=expands or bool(expanding),
        )
        self.analysis.commands.append(command)
        if 0 in expanding:
            self.analysis.opaque.append("the program to run comes from a variable")
        for position in command_positions(command.argv):
            self._look_inside(position)

    def _look_inside(self, argv: tuple[str, ...]) -> None:
        """Follow commands that run code given as a string: sh -c, eval, shells on stdin."""
        if not argv:
            return
        name = _basename(argv[0])
        script: str | None = None
        if name in SHELLS:
            script_index = _shell_script_index(argv)
            if script_index is None:
                if any(not a.startswith("-") for a in argv[1:]):
                    self.analysis.opaque.append(f"it runs a script file with {name}")
                else:
                    self.analysis.opaque.append(f"it feeds commands to {name} on standard input")
                return
            if script_index >= len(argv):
                self.analysis.opaque.append(f"{name} -c without a script")
                return
            script = argv[script_index]
        elif name == "eval":
            script = " ".join(argv[1:])
        elif name in ("source", "."):
            self.analysis.opaque.append("it sources a script file")
            return
        if script is None:
            return
        if self.depth >= MAX_NESTING:
            self.analysis.opaque.append("shell scripts are nested too deeply to check")
            return
        inner = analyze(script, depth=self.depth + 1)
        if inner.error:
            self.analysis.opaque.append(f"the script given to {name} could not be parsed")
        self.analysis.commands.extend(inner.commands)
        self.analysis.substitutions.extend(inner.substitutions)
        self.analysis.opaque.extend(inner.opaque)
        self.analysis.background |= inner.background


def _children(node) -> Iterator:
    for name, value in vars(node).items():
        if name == "pos":
            continue
        if hasattr(value, "kind"):
            yield value
        elif isinstance(value, list):
            yield from (item for item in value if hasattr(item, "kind"))


def _shell_script_index(argv: tuple[str, ...]) -> int | None:
    """Index of the script in `sh [options] -c SCRIPT`, or None if there is no -c."""
    for index, word in enumerate(argv[1:], start=1):
        if word == "--" or not word.startswith("-") or word.startswith("--"):
            if word.startswith("--") and word != "--":
                continue  # long options such as --norc
            return None
        if "c" in word[1:]:
            return index + 1
    return None


def command_positions(argv: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The command itself and every command it runs through a wrapper or find -exec
    (tools.shell.normalize takes the wrappers off)."""
    layers, _ = every_layer(Layer.of(argv))
    return [layer.argv for layer in layers if layer.argv]


def _parse(command: str) -> list:
    try:
        return bashlex.parse(command)
    except NotImplementedError:
        # bashlex does not implement `time`, which only times the pipeline after
        # it: parse the line with the keyword blanked out. The blanks keep its
        # length, so positions in the source still hold.
        blanked = _TIME_KEYWORD.sub(
            lambda m: m.group(1) + m.group(2) + " " * len(m.group(3)), command
        )
        if blanked == command:
            raise
        return bashlex.parse(blanked)


def analyze(command: str, depth: int = 0) -> CommandAnalysis:
    """Parse `command` as bash would and collect what it runs."""
    analysis = CommandAnalysis(source=command)
    if "\x00" in command:
        analysis.error = "the command contains a NUL byte"
        return analysis
    try:
        trees = _parse(command)
    except (bashlex.errors.ParsingError, NotImplementedError, AttributeError, IndexError) as exc:
        analysis.error = str(exc) or type(exc).__name__
        return analysis
    except Exception as exc:  # bashlex has more failure modes than it documents
        analysis.error = f"{type(exc).__name__}: {exc}"
        return analysis
    collector = _Collector(analysis, depth)
    for tree in trees:
        collector.visit(tree)
    # Belt and braces: if the parser saw no substitution, the raw text must agree.
    if not analysis.substitutions and ("`" in command or "$(" in command):
        analysis.opaque.append("it contains '`' or '$(' that the parser did not account for")
    return analysis
