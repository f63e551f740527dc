"""What a simple command really runs, for matching it against rules.

`sudo env FOO=1 nice -n 5 /usr/bin/git --no-pager -c color.ui=never push`
runs `git push`. reduce_command() takes the wrappers off one at a time
(tools.shell.wrappers), then git's global options, keeping every step as
a Layer, outermost first:

    sudo env FOO=1 nice ... push  ->  env FOO=1 nice ... push  ->  nice ... push
    ->  /usr/bin/git --no-pager -c color.ui=never push  ->  /usr/bin/git push

A deny rule matches any layer, by the program's basename (and `git-push`
counts as `git push`); a word it cannot read for certain (an expansion,
a glob, a wrapper option it does not know) means "cannot tell", and the
caller asks. An allow rule covers the command as written, or its last
layer when every step on the way changes nothing but how it runs (`nice`,
`timeout`, `env FOO=1`, `git --no-pager`): never through sudo, xargs, a
wrapper named by a path, `env -C`, `git -c` or `git -C`, and always with
the program written exactly as in the rule.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tools.shell.wrappers import Peel, Word, peel

MAX_LAYERS = 12
_FIND_EXEC = frozenset({"-exec", "-execdir", "-ok", "-okdir"})
_BRACES = re.compile(r"\{[^{}]*(,|\.\.)[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\]]*\]")

# git's global options (git.c, handle_options): flags, and those with a value
# (in the next word, or after '=' for the long ones).
_GIT_FLAGS = frozenset(
    {"-p", "--paginate", "-P", "--no-pager", "--no-replace-objects", "--no-lazy-fetch",
     "--no-optional-locks", "--no-advice", "--bare", "--literal-pathspecs", "--glob-pathspecs",
     "--noglob-pathspecs", "--icase-pathspecs"}
)  # fmt: skip
_GIT_VALUED = frozenset(
    {"-C", "-c", "--config-env", "--git-dir", "--work-tree", "--namespace", "--super-prefix",
     "--attr-source"}
)  # fmt: skip
# Flags that only change how git prints or matches: `git --no-pager log` is `git log`.
_GIT_TRANSPARENT = frozenset(
    {"-p", "--paginate", "-P", "--no-pager", "--no-replace-objects", "--no-lazy-fetch",
     "--no-optional-locks", "--no-advice", "--literal-pathspecs", "--glob-pathspecs",
     "--noglob-pathspecs", "--icase-pathspecs"}
)  # fmt: skip
_GIT_PRINT_AND_EXIT = frozenset({"--exec-path", "--html-path", "--man-path", "--info-path"})
# git -c settings that cannot make git run another program or rename a subcommand.
_GIT_HARMLESS_CONFIG = re.compile(
    r"(color|column|advice|i18n)\.[\w.-]+|core\.(quotepath|abbrev)|user\.(name|email)"
    r"|init\.defaultbranch|safe\.directory",
    re.IGNORECASE,
)


def is_pattern(word: str) -> bool:
    """Whether bash may turn the word into other words (a glob or a brace expansion)."""
    return "*" in word or "?" in word or bool(_BRACKETS.search(word) or _BRACES.search(word))


@dataclass(frozen=True)
class Layer:
    argv: tuple[str, ...]
    unknown: frozenset[int] = frozenset()  # words whose value is not known in advance
    open_tail: bool = False  # more words follow, unknown in advance (xargs)

    @classmethod
    def of(cls, argv: Sequence[str], expanding: frozenset[int] = frozenset()) -> Layer:
        """A command as the parser saw it; `expanding` indexes its words that expand."""
        unknown = {i for i, w in enumerate(argv) if i in expanding or "$" in w or is_pattern(w)}
        return cls(tuple(argv), frozenset(unknown))

    @classmethod
    def from_words(cls, words: Sequence[Word], open_tail: bool = False) -> Layer:
        return cls(
            tuple(w for w, _ in words),
            frozenset(i for i, (w, u) in enumerate(words) if u or "$" in w or is_pattern(w)),
            open_tail,
        )

    def words(self) -> list[Word]:
        return [(w, i in self.unknown) for i, w in enumerate(self.argv)]


@dataclass(frozen=True)
class Reduction:
    layers: tuple[Layer, ...]  # outermost first; the last is what finally runs
    assignments: tuple[str, ...] = ()  # NAME=value that wrappers (env, sudo) set
    notes: tuple[str, ...] = ()  # what the wrappers change besides running the last layer
    problem: str | None = None  # why the reduction could not reach what finally runs

    @property
    def final(self) -> Layer:
        return self.layers[-1]

    @property
    def transparent(self) -> bool:
        """Running the last layer plainly would do the same as the whole command."""
        return self.problem is None and not self.notes


def program_name(word: str) -> str:
    return os.path.basename(word) if "/" in word else word


def reduce_command(argv: Sequence[str], expanding: frozenset[int] = frozenset()) -> Reduction:
    return reduce_layer(Layer.of(argv, expanding))


def reduce_layer(first: Layer) -> Reduction:
    layers = [first]
    assignments: list[str] = []
    notes: list[str] = []
    for _ in range(MAX_LAYERS):
        layer = layers[-1]
        if not layer.argv:
            break
        if 0 in layer.unknown:
            problem = "the program it runs comes from an expansion or a pattern"
            return Reduction(tuple(layers), tuple(assignments), tuple(notes), problem)
        name = program_name(layer.argv[0])
        step = _peel_git(layer) if name == "git" or name.startswith("git-") else None
        step = step or peel(name, layer.words())
        if step is None:
            break
        assignments += step.assignments
        notes += step.notes
        if "/" in layer.argv[0] and step.inner is not None:
            notes.append(f"{layer.argv[0]} may not be the system's {name}")
        if step.problem:
            return Reduction(tuple(layers), tuple(assignments), tuple(notes), step.problem)
        if not step.inner:
            break
        layers.append(Layer.from_words(step.inner, step.open_tail or layer.open_tail))
    else:
        problem = "it nests wrappers too deeply to follow"
        return Reduction(tuple(layers), tuple(assignments), tuple(notes), problem)
    return Reduction(tuple(layers), tuple(assignments), tuple(dict.fromkeys(notes)))


def _peel_git(layer: Layer) -> Peel | None:
    """git's global options taken off (`git -C x --no-pager push` -> `git push`), and
    `git-push` read as `git push`; None when there is nothing to take off."""
    words = layer.words()
    name = program_name(words[0][0])
    if name.startswith("git-"):
        inner = [("git", False), (name[4:], False), *words[1:]]
        return Peel(tuple(inner), notes=(f"{words[0][0]} is run directly",))
    index, notes = 1, []
    while index < len(words) and words[index][0].startswith("-"):
        word, unknown = words[index]
        if unknown:
            return Peel(None, problem="an option given to git comes from an expansion")
        option, has_value, value = word.partition("=")
        if option in ("-v", "--version", "-h", "--help"):
            # git turns these into its `version` and `help` commands.
            inner = [("git", False), ("version" if "v" in option else "help", False)]
            return Peel((*inner, *words[index + 1 :]), notes=tuple(notes) or ("git " + word,))
        if option in _GIT_PRINT_AND_EXIT and not (option == "--exec-path" and has_value):
            return Peel(None)
        if option == "--list-cmds":
            return Peel(None)
        if option == "--exec-path":
            return Peel(None, problem="git --exec-path runs git commands from another directory")
        if option in _GIT_FLAGS:
            if option not in _GIT_TRANSPARENT:
                notes.append(f"git {option} changes which repository it works on")
            index += 1
            continue
        if option not in _GIT_VALUED or (has_value and option in ("-c", "-C")):
            return Peel(None, problem=f"git is given an option the checker does not know ({word})")
        if not has_value:
            if index + 1 >= len(words):
                return Peel(None)
            value, unknown = words[index + 1]
            if unknown:
                return Peel(None, problem=f"the value of git {option} comes from an expansion")
            index += 1
        index += 1
        if option in ("-c", "--config-env"):
            key = value.split("=", 1)[0]
            if not _GIT_HARMLESS_CONFIG.fullmatch(key):
                return Peel(None, problem=f"git {option} {key} can make git run other programs")
            notes.append(f"git {option} changes its configuration")
        else:
            notes.append(f"git {option} changes which repository it works on")
    if index == 1:
        return None
    return Peel((words[0], *words[index:]), notes=tuple(notes))


def find_exec_layers(layer: Layer) -> list[Layer]:
    """The commands `find ... -exec CMD ... ;` runs; '{}' stands for found names."""
    found = []
    index = 1
    while index < len(layer.argv):
        if layer.argv[index] in _FIND_EXEC:
            end = index + 1
            while end < len(layer.argv) and layer.argv[end] not in (";", "+"):
                end += 1
            if end > index + 1:
                words = [
                    (w, i in layer.unknown or "{}" in w)
                    for i, w in enumerate(layer.argv[index + 1 : end], start=index + 1)
                ]
                found.append(Layer.from_words(words))
            index = end
        index += 1
    return found


def every_layer(first: Layer) -> tuple[list[Layer], str | None]:
    """Every command a simple command runs (its wrappers, what they run, what find
    -exec runs) and the first reason something it runs could not be told."""
    layers: list[Layer] = []
    problem: str | None = None
    pending = [first]
    while pending and len(layers) < 4 * MAX_LAYERS:
        reduction = reduce_layer(pending.pop(0))
        layers.extend(reduction.layers)
        problem = problem or reduction.problem
        for layer in reduction.layers:
            if layer.argv and program_name(layer.argv[0]) == "find":
                pending.extend(find_exec_layers(layer))
    if pending:
        problem = problem or "it nests commands too deeply to follow"
    return layers, problem


def deny_match(layer: Layer, prefix: Sequence[str]) -> bool | None:
    """Whether a deny rule's prefix matches the layer: the program by basename, the
    other words exactly; None when a word that decides it is not known in advance."""
    if not prefix:
        return False
    for index, wanted in enumerate(prefix):
        if index >= len(layer.argv):
            return None if layer.open_tail else False
        if index in layer.unknown:
            return None
        word = layer.argv[index]
        if word != wanted and not (
            index == 0 and "/" not in wanted and program_name(word) == wanted
        ):
            return False
    return True


def deny_hits(first: Layer, prefixes: Sequence[Sequence[str]]) -> bool | None:
    """Whether anything the command runs matches one of the prefixes; None when that
    cannot be ruled out."""
    layers, problem = every_layer(first)
    unsure = problem is not None
    for layer in layers:
        for prefix in prefixes:
            match = deny_match(layer, prefix)
            if match:
                return True
            unsure |= match is None
    return None if unsure else False


def deny_prefixes(tokens: Sequence[str]) -> list[tuple[str, ...]]:
    """A deny rule's prefix, and what it reduces to: `shell:sudo git push` also
    denies `git push` (erring towards denying)."""
    prefixes = [tuple(tokens)]
    if tokens:
        reduction = reduce_command(tokens)
        final = reduction.final.argv
        if reduction.problem is None and final and final != tuple(tokens):
            prefixes.append(final)
    return prefixes


def allow_match(layer: Layer, prefix: Sequence[str]) -> bool:
    """Whether an allow rule's prefix covers the layer: every word of the prefix
    written exactly (the program too: `./make` is not `make`), none of them unknown."""
    if not prefix or len(layer.argv) < len(prefix):
        return False
    if any(index < len(prefix) for index in layer.unknown):
        return False
    return layer.argv[: len(prefix)] == tuple(prefix)


def allow_covers(first: Layer, reduction: Reduction, prefix: Sequence[str]) -> bool:
    """An allow rule covers the command as written, or what it reduces to when the
    wrappers on the way change nothing else. Never a command the reduction could not
    follow: what it hides (`sudo --odd sh -c '...'`) is not among the commands the
    rules were checked against."""
    if reduction.problem is not None:
        return False
    if allow_match(first, prefix):
        return True
    return (
        reduction.transparent
        and not reduction.final.open_tail
        and allow_match(reduction.final, prefix)
    )
