"""The repository map: what stands in for the snapshot when the repository does not fit.

It has three parts, cheapest first: the file tree with each file's size and
the symbols it defines (what a person skims to find their way), then as many
of the most relevant files in full as the budget allows. Relevance is a
score: files the task names, the files that say what the project is
(README, AGENTS.md, build manifests), and files many others refer to by
name (a cheap stand-in for an import graph), smaller files first on ties.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePosixPath

from agent.core.context.selection import RepoFile

KEY_FILES = {
    "readme.md",
    "readme.rst",
    "readme.txt",
    "readme",
    "agents.md",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "package.json",
    "cargo.toml",
    "go.mod",
    "makefile",
    "cmakelists.txt",
}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
_SYMBOL_PATTERNS: dict[str, re.Pattern[str]] = {
    ".py": re.compile(r"^(?:async\s+def|def|class)\s+(\w+)", re.MULTILINE),
    ".js": re.compile(
        r"^(?:export\s+)?(?:default\s+)?(?:async\s+)?(?:function\*?|class|const|let)\s+(\w+)",
        re.MULTILINE,
    ),
    ".go": re.compile(r"^(?:func(?:\s*\([^)]*\))?|type)\s+(\w+)", re.MULTILINE),
    ".rs": re.compile(
        r"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:fn|struct|enum|trait|mod|impl)\s+(\w+)",
        re.MULTILINE,
    ),
    ".java": re.compile(
        r"^\s*(?:public|protected|private)?\s*(?:static\s+)?(?:final\s+)?(?:class|interface|enum|record)\s+(\w+)",
        re.MULTILINE,
    ),
    ".rb": re.compile(r"^\s*(?:def|class|module)\s+([\w.]+)", re.MULTILINE),
}
for _alias, _lang in {
    ".ts": ".js",
    ".tsx": ".js",
    ".jsx": ".js",
    ".mjs": ".js",
    ".kt": ".java",
}.items():
    _SYMBOL_PATTERNS[_alias] = _SYMBOL_PATTERNS[_lang]
MAX_SYMBOLS_PER_FILE = 12


def symbols(file: RepoFile) -> list[str]:
    pattern = _SYMBOL_PATTERNS.get(PurePosixPath(file.path).suffix.lower())
    if pattern is None:
        return []
    names = list(dict.fromkeys(pattern.findall(file.text)))
    return names


def _mentions(text: str, name: str) -> bool:
    """`name` appears in `text` as a whole path (not inside a longer name)."""
    return re.search(rf"(?<![\w/.-]){re.escape(name)}(?![\w/-])", text) is not None


def rank_files(files: list[RepoFile], task: str = "") -> list[RepoFile]:
    """Files, most relevant first."""
    mentioned_words = set(_WORD.findall(task))
    word_files: Counter[str] = Counter()
    for file in files:
        word_files.update(set(_WORD.findall(file.text)))

    def score(file: RepoFile) -> tuple[float, int, str]:
        path = PurePosixPath(file.path)
        value = 0.0
        if _mentions(task, file.path) or (len(path.name) > 3 and _mentions(task, path.name)):
            value += 100
        elif path.stem in mentioned_words and len(path.stem) > 3:
            value += 40
        if path.name.lower() in KEY_FILES:
            value += 30 - 5 * len(path.parts)  # the root's README over a nested one
        refs = word_files.get(path.stem, 0) - (1 if path.stem in file.text else 0)
        value += 5 * math.log1p(max(refs, 0))
        if "test" in path.parts[0].lower() or path.name.startswith("test_"):
            value -= 3
        return (-value, file.size, file.path)

    return sorted(files, key=score)


@dataclass
class RepoMap:
    text: str
    tokens: int
    shown: list[RepoFile]  # files included in full


def _tree_lines(files: list[RepoFile], with_symbols: bool) -> list[str]:
    lines = []
    for file in files:
        line = f"{file.path} ({file.text.count(chr(10)) + 1} lines)"
        names = symbols(file) if with_symbols else []
        if names:
            extra = len(names) - MAX_SYMBOLS_PER_FILE
            shown = ", ".join(names[:MAX_SYMBOLS_PER_FILE])
            line += f": {shown}" + (f", … (+{extra})" if extra > 0 else "")
        lines.append(line)
    return lines


def _directory_lines(files: list[RepoFile]) -> list[str]:
    counts: Counter[str] = Counter(str(PurePosixPath(f.path).parent) for f in files)
    return [f"{directory}/ ({count} files)" for directory, count in sorted(counts.items())]


def build_repo_map(
    files: list[RepoFile],
    budget: int,
    count_tokens: Callable[[str], int],
    render_file: Callable[[RepoFile], str],
    header: str,
    task: str = "",
) -> RepoMap:
    """A map that fits `budget` tokens: tree (with symbols when they fit), then top files."""
    intro = (
        f"{header}\nThis repository is too large to show in full. First every file with its "
        "length and the symbols it defines, then the most relevant files in full. Read any "
        "other file with the `read` tool.\n"
    )
    tree = ""
    for lines in (_tree_lines(files, True), _tree_lines(files, False), _directory_lines(files)):
        tree = "<tree>\n" + "\n".join(lines) + "\n</tree>\n"
        if count_tokens(intro + tree) <= budget // 2:
            break
    closing = "</repository>\n"
    used = count_tokens(intro + tree + closing)
    if used > budget:  # even the directory list does not fit: say so, show nothing
        tree = f"<tree>\n({len(files)} files; too many to list)\n</tree>\n"
        used = count_tokens(intro + tree + closing)
    parts = [intro, tree]
    shown: list[RepoFile] = []
    for file in rank_files(files, task):
        if file.size // 8 > budget - used:
            continue  # no tokenizer packs more than 8 bytes a token: cannot fit
        block = render_file(file)
        cost = count_tokens(block)
        if used + cost > budget:
            continue  # a smaller, less relevant file may still fit
        parts.append(block)
        shown.append(file)
        used += cost
    parts.append(closing)
    text = "".join(parts)
    return RepoMap(text=text, tokens=count_tokens(text), shown=sorted(shown, key=lambda f: f.path))
