"""The gitignore matcher used outside git must agree with git itself."""

from __future__ import annotations

import pytest

from tests.tools.conftest import git
from tools.workspace.globbing import compile_glob
from tools.workspace.ignore import IgnoreMatcher, parse_lines
from tools.workspace.walk import visible_files

ROOT_GITIGNORE = r"""
# comment
*.log
!keep.log
build/
/root_only.txt
docs/**/*.tmp
**/cache
a/**/b
foo?.txt
[abc].dat
[!x]y.cfg
\#hash
trailing\<SP>
spaced<SP><SP><SP>
dironly/
secret*
!secret_ok*
*.o
!vendor/*.o
""".replace("<SP>", " ")  # trailing spaces, written visibly

NESTED_GITIGNORE = """
*.md
!important.md
/local.txt
"""

FILES = [
    "main.py", "debug.log", "keep.log", "sub/keep.log", "sub/other.log",
    "build/out.bin", "src/build/out.bin", "build.txt",
    "root_only.txt", "sub/root_only.txt",
    "docs/x.tmp", "docs/a/b/y.tmp", "docs/readme.txt",
    "cache/data", "deep/er/cache/data", "cachefile",
    "a/x/y/b", "a/b/c.txt", "ab", "a/bb",
    "foo1.txt", "foo12.txt", "a.dat", "d.dat", "zy.cfg", "xy.cfg",
    "#hash", "trailing ", "spaced", "spaced   ",
    "dironly/f", "x/dironly", "secret.txt", "secret_ok.txt",
    "lib.o", "vendor/lib.o", "vendor/deep/lib.o",
    "nested/a.md", "nested/important.md", "nested/local.txt", "nested/sub/local.txt",
    "nested/sub/b.md", "README.md",
]  # fmt: skip


def _build(root):
    for name in FILES:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    (root / ".gitignore").write_text(ROOT_GITIGNORE)
    (root / "nested" / ".gitignore").write_text(NESTED_GITIGNORE)


def test_walker_agrees_with_git_on_a_tricky_tree(tmp_path):
    plain = tmp_path / "plain"
    repo = tmp_path / "repo"
    for root in (plain, repo):
        root.mkdir()
        _build(root)
    git(repo, "init", "-q")
    expected = sorted(
        name
        for name in git(repo, "ls-files", "-z", "--others", "--exclude-standard").split("\0")
        if name
    )
    ours = sorted(visible_files(plain, plain))
    assert ours == expected
    # Sanity: the tree really exercises ignoring and re-including.
    assert "debug.log" not in ours and "keep.log" in ours and "sub/other.log" not in ours


def test_walking_a_subdirectory_applies_the_parent_rules(tmp_path):
    _build(tmp_path)
    assert sorted(visible_files(tmp_path, tmp_path / "nested")) == [
        ".gitignore", "important.md", "sub/local.txt",
    ]  # fmt: skip


def test_negation_cannot_reinclude_inside_an_ignored_directory():
    matcher = IgnoreMatcher(parse_lines(["build/", "!build/keep.txt"]))
    assert matcher.is_ignored("build/keep.txt")
    assert not matcher.is_ignored("src/keep.txt")


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("**/*.py", "a.py", True),
        ("**/*.py", "x/y/a.py", True),
        ("*.py", "x/a.py", False),
        ("src/**", "src/a/b.c", True),
        ("src/**/test_*.py", "src/test_a.py", True),
        ("src/**/test_*.py", "src/x/y/test_a.py", True),
        ("*.{ts,tsx}", "a.tsx", True),
        ("*.{ts,tsx}", "a.js", False),
        ("[ab]?.txt", "bz.txt", True),
        ("[!ab]?.txt", "az.txt", False),
        ("a*b", "a/b", False),
    ],
)
def test_glob_translation(pattern, path, matches):
    assert (compile_glob(pattern).match(path) is not None) is matches
