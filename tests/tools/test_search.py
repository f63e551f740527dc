"""list, glob and grep: ignored files stay out, results are capped, both grep engines agree."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.tools.conftest import commit_all, init_repo
from tools import ToolContext, ToolLimits, default_registry

needs_rg = pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")


def _project(root):
    files = {
        "src/app.py": "import os\n\ndef main():\n    return 'Hello'\n",
        "src/util.py": "def helper():\n    return 'hello world'\n",
        "src/web/view.tsx": "export const Hello = () => null\n",
        "tests/test_app.py": "from src.app import main\n",
        "README.md": "# Hello project\n",
        "build/generated.py": "HELLO = 1\n",
        "debug.log": "hello from a log\n",
        ".env": "API_KEY=hello-secret\n",
        ".gitignore": "build/\n*.log\n",
    }
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "src" / "blob.bin").write_bytes(b"hello\x00\x01\x02")


@pytest.fixture(params=["plain", "git"])
def project(request, workspace):
    _project(workspace)
    if request.param == "git":
        init_repo(workspace)
        commit_all(workspace)
        (workspace / "src" / "untracked.py").write_text("print('hello untracked')\n")
    return workspace


def test_list_shows_a_tree_without_ignored_files(call, project):
    result = call("list", path=".")
    assert result.ok
    assert "src/" in result.output and "app.py" in result.output and "web/" in result.output
    for hidden in ("build", "debug.log", ".git/"):
        assert hidden not in result.output
    assert "view.tsx" not in result.output  # depth 2 stops at src/web/


def test_list_depth_and_subdirectory(call, project):
    result = call("list", path="src", depth=3)
    assert result.output.startswith("src/")
    assert "view.tsx" in result.output


def test_list_refuses_files_and_missing_directories(call, project):
    assert not call("list", path="README.md").ok
    assert not call("list", path="nope").ok


def test_glob_matches_recursively_and_sorted(call, project):
    result = call("glob", pattern="**/*.py")
    paths = result.output.splitlines()
    assert paths == sorted(paths)
    assert "src/app.py" in paths and "tests/test_app.py" in paths
    assert "build/generated.py" not in paths
    assert call("glob", pattern="*.md").output.splitlines() == ["README.md"]
    assert call("glob", pattern="**/*.{tsx,md}").output.splitlines() == [
        "README.md",
        "src/web/view.tsx",
    ]
    assert call("glob", pattern="*.py", path="src").output.splitlines()[0] == "src/app.py"


def test_glob_cap(workspace):
    for i in range(30):
        (workspace / f"f{i:02d}.txt").write_text("x")
    ctx = ToolContext(workspace=workspace, limits=ToolLimits(glob_max_results=10))
    result = default_registry().call("glob", {"pattern": "*.txt"}, ctx)
    assert result.truncated and "20 more matches" in result.output


def _grep(project, use_ripgrep, **arguments):
    ctx = ToolContext(workspace=project, use_ripgrep=use_ripgrep)
    return default_registry().call("grep", arguments, ctx)


def _check_grep_semantics(project, use_ripgrep):
    result = _grep(project, use_ripgrep, pattern="hello")
    assert result.ok
    lines = result.output.splitlines()
    assert "src/util.py:2:    return 'hello world'" in lines
    joined = result.output
    for excluded in ("build/generated.py", "debug.log", ".env", "blob.bin", "hello-secret"):
        assert excluded not in joined
    insensitive = _grep(project, use_ripgrep, pattern="hello", case_insensitive=True)
    assert "src/app.py:4:    return 'Hello'" in insensitive.output
    files = _grep(project, use_ripgrep, pattern="hello", case_insensitive=True, files_only=True)
    assert "README.md" in files.output.splitlines()
    only_py = _grep(project, use_ripgrep, pattern="(?i)hello", glob="*.py")
    assert "README.md" not in only_py.output and "src/app.py" in only_py.output
    scoped = _grep(project, use_ripgrep, pattern="return", path="src/web")
    assert scoped.output.startswith("No matches")
    return result


def test_grep_python_engine(project):
    result = _check_grep_semantics(project, use_ripgrep=False)
    assert result.data["engine"] == "python"


@needs_rg
def test_grep_ripgrep_engine_agrees_with_python(project):
    result = _check_grep_semantics(project, use_ripgrep=True)
    assert result.data["engine"] == "ripgrep"
    python = _grep(project, False, pattern="hello|main", case_insensitive=True)
    ripgrep = _grep(project, True, pattern="hello|main", case_insensitive=True)
    assert sorted(python.output.splitlines()) == sorted(ripgrep.output.splitlines())


@pytest.mark.parametrize("use_ripgrep", [False, pytest.param(True, marks=needs_rg)])
def test_grep_results_are_capped(workspace, use_ripgrep):
    (workspace / "many.txt").write_text("match\n" * 500)
    ctx = ToolContext(
        workspace=workspace, use_ripgrep=use_ripgrep, limits=ToolLimits(grep_max_results=20)
    )
    result = default_registry().call("grep", {"pattern": "match"}, ctx)
    assert result.truncated
    assert result.output.count("many.txt:") == 20
    assert "Stopped after 20 results" in result.output


@pytest.mark.parametrize("use_ripgrep", [False, pytest.param(True, marks=needs_rg)])
def test_grep_look_around_and_invalid_patterns(workspace, use_ripgrep):
    (workspace / "a.py").write_text("foobar\nfoobaz\n")
    result = _grep(workspace, use_ripgrep, pattern="foo(?=baz)")
    assert result.ok and "a.py:2:foobaz" in result.output  # ripgrep falls back to Python
    bad = _grep(workspace, use_ripgrep, pattern="(unclosed")
    assert not bad.ok and "Invalid regular expression" in bad.output


def test_grep_truncates_long_lines(workspace):
    (workspace / "min.js").write_text("x" * 5000 + "needle" + "y" * 5000 + "\n")
    result = _grep(workspace, False, pattern="needle")
    assert "line truncated" in result.output and len(result.output) < 1000


@pytest.mark.parametrize("use_ripgrep", [False, pytest.param(True, marks=needs_rg)])
def test_residents_folders_in_a_home_workspace_are_never_walked(project, use_ripgrep):
    """Resident started in $HOME: its config, data and cache folders lie in the workspace
    (tracked, in git: a dotfiles repository). No search or listing enters them, from the
    top or from a folder above them; their files are read by name, which asks."""
    folders = (".config/resident", ".local/share/resident", ".cache/resident")
    for folder in folders:
        (project / folder).mkdir(parents=True)
        (project / folder / "state.json").write_text('{"token": "hello-token"}\n')
    if (project / ".git").exists():
        commit_all(project, "dotfiles")
    env = {"HOME": str(project), "PATH": os.defpath}
    ctx = ToolContext(workspace=project, env=env, use_ripgrep=use_ripgrep)
    registry = default_registry()
    found = registry.call("grep", {"pattern": "hello", "case_insensitive": True}, ctx)
    assert "src/util.py" in found.output and "token" not in found.output
    for path in (".", ".config", ".local/share", ".cache"):
        listed = registry.call("glob", {"pattern": "**/*", "path": path}, ctx).output
        tree = registry.call("list", {"path": path, "depth": 10}, ctx).output
        searched = registry.call("grep", {"pattern": "token", "path": path}, ctx).output
        assert "state.json" not in listed + tree and searched.startswith("No matches")
    assert "README.md" in registry.call("glob", {"pattern": "*.md"}, ctx).output
