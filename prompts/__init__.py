"""System and task prompts as text files next to this module, plus a small loader.

Prompts are plain text so they can be read and changed without touching
code. Placeholders are `{name}`; `load` fills them and fails loudly on a
missing value, so a prompt never reaches a model with a hole in it.
"""

from __future__ import annotations

import string
from functools import cache
from importlib import resources


class PromptError(KeyError):
    pass


@cache
def raw(name: str) -> str:
    """The text of prompts/<name>.md, unfilled."""
    path = resources.files(__name__).joinpath(f"{name}.md")
    if not path.is_file():
        raise PromptError(f"no prompt named {name!r} (looked for prompts/{name}.md)")
    return path.read_text(encoding="utf-8")


def placeholders(name: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(raw(name)) if field}


def load(name: str, **values: str) -> str:
    """prompts/<name>.md with its `{placeholders}` filled from `values`."""
    missing = placeholders(name) - set(values)
    if missing:
        raise PromptError(f"prompt {name!r} needs values for: {', '.join(sorted(missing))}")
    return raw(name).format(**values).strip() + "\n"
