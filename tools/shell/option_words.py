"""Reading option words the way getopt_long and git's parse-options read them.

Both accept a long option abbreviated to any prefix that is not ambiguous
(`sort --outp=x` is `sort --output=x`), so a check that compares option
words to a forbidden name with `==` or `startswith` is fooled. These
helpers err towards a match: an ambiguous abbreviation, which the program
itself rejects, still counts.
"""

from __future__ import annotations

from collections.abc import Iterable


def long_name(word: str) -> str | None:
    """'--output' of '--output=x' or '--output'; None for anything else (and for '--')."""
    if not word.startswith("--") or word == "--":
        return None
    return word.split("=", 1)[0]


def names_long_option(word: str, option: str, *, exact: Iterable[str] = ()) -> bool:
    """True when `word` is `option` (a '--name'), with or without '=value', or an
    abbreviation of it. `exact` lists other real options that are prefixes of
    `option` (git's '--text' of '--textconv'): written in full they mean themselves."""
    name = long_name(word)
    if name is None or name in exact:
        return False
    return option.startswith(name)


def names_any_long_option(word: str, options: Iterable[str], *, exact: Iterable[str] = ()) -> str:
    """The first of `options` that `word` names (see names_long_option), or ''."""
    exact = tuple(exact)
    return next((o for o in options if names_long_option(word, o, exact=exact)), "")


def resolve_long(word: str, known: Iterable[str]) -> str | None:
    """The option among `known` that `word` names: an exact match, else the one
    option it abbreviates. None when it names none, or more than one."""
    name = long_name(word)
    if name is None:
        return None
    known = tuple(known)
    if name in known:
        return name
    matches = [option for option in known if option.startswith(name)]
    return matches[0] if len(matches) == 1 else None


def short_letters(word: str, valued: str = "") -> str:
    """The option letters of a short-option word ('-nro' -> 'nro'), stopping after the
    first letter in `valued`, whose value is the rest of the word. '' for other words."""
    if not word.startswith("-") or word.startswith("--") or word == "-":
        return ""
    letters = []
    for letter in word[1:]:
        letters.append(letter)
        if letter in valued:
            break
    return "".join(letters)


def has_short(word: str, letters: str, valued: str = "") -> str:
    """The first of `letters` among the option letters of `word`, or ''."""
    return next((letter for letter in short_letters(word, valued) if letter in letters), "")
