"""A custom command's file as text: its front matter, its prompt template, its expansion.

The file format is the one Claude Code's command files use, so a folder of
them can be shared: optional front matter between `---` lines, of which only
`description` and `argument-hint` are read (simple `key: value` lines, parsed
by hand; other keys, e.g. Claude Code's `allowed-tools`, are ignored), then
the prompt. In the prompt `$ARGUMENTS` becomes everything typed after the
command's name and `$1`..`$9` its words, split as a shell would (quotes
group, no other escapes); a placeholder that is none of these stays as typed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DESCRIPTION_CHARS = 80
FENCE = "---"
# `$ARGUMENTS` but not `$ARGUMENTS_X`; `$1`..`$9` but not `$10` or `$100` (money, say).
PLACEHOLDER = re.compile(r"\$(ARGUMENTS(?![A-Za-z0-9_])|[1-9](?![0-9]))")
HINT_KEYS = ("argument-hint", "argument_hint")


@dataclass(frozen=True)
class CommandText:
    description: str  # one line for menus, never empty
    argument_hint: str  # e.g. "[FILE]"; "" when the file gives none
    template: str  # the prompt, placeholders unexpanded


class EmptyCommand(ValueError):
    """The file has no prompt (nothing after its front matter)."""


def _unquoted(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """(front matter keys, lowercased, to values; the rest). A first `---` line with no
    closing one is not front matter: a Markdown file may well start with a rule."""
    lines = text.splitlines(keepends=True)
    if not lines or lines[0].strip() != FENCE:
        return {}, text
    for end in range(1, len(lines)):
        if lines[end].strip() == FENCE:
            fields: dict[str, str] = {}
            for line in lines[1:end]:
                key, colon, value = line.partition(":")
                if colon and key.strip() and not key.startswith((" ", "\t", "#")):
                    fields[key.strip().lower()] = _unquoted(value)
            return fields, "".join(lines[end + 1 :])
    return {}, text


def one_line(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    """`text` on one line of at most `limit` characters, cut with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def parse_command_text(text: str) -> CommandText:
    """A command file's text as its parts. Raises EmptyCommand when there is no prompt."""
    fields, body = split_front_matter(text)
    template = body.strip()
    if not template:
        raise EmptyCommand("has no prompt after its front matter")
    description = fields.get("description", "")
    if not description:
        first = next(line for line in template.splitlines() if line.strip())
        description = first.strip().lstrip("#").strip()
    hint = next((fields[key] for key in HINT_KEYS if fields.get(key)), "")
    return CommandText(one_line(description) or "(no description)", one_line(hint), template)


def split_words(text: str) -> list[str]:
    """Words as a shell splits them, with quotes only: `'a b'` and `"a b"` are one word,
    quotes inside a word join (`x"y z"` is `xy z`), and a quote left open runs to the end
    (what was typed is not refused for it)."""
    words: list[str] = []
    current: list[str] = []
    quote = ""
    in_word = False
    for char in text:
        if quote:
            if char == quote:
                quote = ""
            else:
                current.append(char)
        elif char in "\"'":
            quote = char
            in_word = True
        elif char.isspace():
            if in_word:
                words.append("".join(current))
                current, in_word = [], False
        else:
            current.append(char)
            in_word = True
    if in_word:
        words.append("".join(current))
    return words


def takes_arguments(template: str) -> bool:
    return PLACEHOLDER.search(template) is not None


def expand(template: str, arguments: str) -> str:
    """The prompt for `/NAME arguments`. In one pass, so text that came in with the
    arguments is never expanded again. A template with no placeholder still gets the
    arguments, after it, rather than dropping what the user typed."""
    arguments = arguments.strip()
    words = split_words(arguments)

    def value(match: re.Match[str]) -> str:
        key = match.group(1)
        if key == "ARGUMENTS":
            return arguments
        index = int(key) - 1
        return words[index] if index < len(words) else ""

    if not takes_arguments(template):
        return f"{template}\n\nArguments: {arguments}" if arguments else template
    return PLACEHOLDER.sub(value, template).strip()
