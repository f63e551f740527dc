"""One symlink-safe reader: links that stay inside are followed, links leading out are
skipped and reported, FIFOs never block, grep reads bounded lines."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath

import pytest

from tests.tools.conftest import commit_all, init_repo
from tools import ToolContext, default_registry
from tools.workspace.ignore import MAX_IGNORE_FILE_BYTES, read_rules_file
from tools.workspace.safe_fs import (
    NotRegularFileError,
    OutsideLinkError,
    UnsafePathError,
    open_confined_file,
    read_confined_bytes,
    resolve_confined,
)
from tools.workspace.walk import visible_files

SECRET = "TOP SECRET"


def finishes(function, seconds: float = 10.0):
    """Run `function` in a daemon thread; fail (rather than hang) if it blocks."""
    outcome: dict = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:  # re-raised in the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{function} blocked for {seconds}s"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def grep(workspace: Path, **arguments):
    ctx = ToolContext(workspace=workspace, use_ripgrep=False)
    return default_registry().call("grep", arguments, ctx)


@pytest.fixture
def hostile(workspace, outside):
    """Every shape of link out, one link that stays inside, and plain files."""
    (outside / "sub").mkdir()
    (outside / "sub" / "deep.txt").write_text(f"{SECRET} deep\n")
    (workspace / "plain.txt").write_text("nothing here\n")
    (workspace / "notes.md").symlink_to(outside / "secret.txt")  # file link out
    (workspace / "docs").symlink_to(outside, target_is_directory=True)  # dir link out
    (workspace / "hop1").symlink_to("hop2")  # a chain that ends outside
    (workspace / "hop2").symlink_to("../outside/secret.txt")
    (workspace / "inner").mkdir()
    (workspace / "inner" / "up.txt").symlink_to("../../outside/secret.txt")  # '..' out
    (workspace / "real.txt").write_text("inside text\n")
    (workspace / "inner" / "alias.txt").symlink_to("../real.txt")  # stays inside
    return workspace


# -- safe_fs --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["notes.md", "docs/secret.txt", "docs/sub/deep.txt", "hop1"])
def test_links_leading_out_raise_a_clear_error(hostile, name):
    with pytest.raises(OutsideLinkError, match="outside the workspace"):
        read_confined_bytes(hostile, PurePosixPath(name), 1 << 20)
    with pytest.raises(OutsideLinkError):
        resolve_confined(hostile, PurePosixPath(name))


def test_dotdot_in_a_link_target_cannot_climb_out(hostile):
    with pytest.raises(OutsideLinkError):
        read_confined_bytes(hostile, PurePosixPath("inner/up.txt"), 100)


def test_links_inside_are_followed_to_their_target(hostile, workspace):
    read = read_confined_bytes(hostile, PurePosixPath("inner/alias.txt"), 100)
    assert read.data == b"inside text\n" and read.target == PurePosixPath("real.txt")
    (workspace / "abs.txt").symlink_to(workspace / "real.txt")  # absolute, but inside
    assert read_confined_bytes(workspace, PurePosixPath("abs.txt"), 100).data == b"inside text\n"
    (workspace / "innerlink").symlink_to("inner", target_is_directory=True)
    via_dir = read_confined_bytes(workspace, PurePosixPath("innerlink/alias.txt"), 100)
    assert via_dir.target == PurePosixPath("real.txt")


def test_without_follow_links_any_link_is_refused(hostile):
    with pytest.raises(UnsafePathError):
        read_confined_bytes(hostile, PurePosixPath("inner/alias.txt"), 100, follow_links=False)


def test_link_loops_stop(workspace):
    (workspace / "a").symlink_to("b")
    (workspace / "b").symlink_to("a")
    with pytest.raises(UnsafePathError) as caught:
        read_confined_bytes(workspace, PurePosixPath("a"), 100)
    assert caught.value.errno == errno.ELOOP


def test_fifo_and_directory_are_refused_without_blocking(workspace):
    os.mkfifo(workspace / "notes.md")
    (workspace / "folder").mkdir()
    with pytest.raises(NotRegularFileError):
        finishes(lambda: read_confined_bytes(workspace, PurePosixPath("notes.md"), 100))
    with pytest.raises(IsADirectoryError):
        read_confined_bytes(workspace, PurePosixPath("folder"), 100)


def test_reads_are_capped(workspace):
    (workspace / "big.txt").write_bytes(b"x" * 5000)
    read = read_confined_bytes(workspace, PurePosixPath("big.txt"), 1000)
    assert len(read.data) == 1000 and read.truncated
    whole = read_confined_bytes(workspace, PurePosixPath("big.txt"), 5000)
    assert len(whole.data) == 5000 and not whole.truncated
    with open_confined_file(workspace, PurePosixPath("big.txt")) as opened:
        assert opened.info.st_size == 5000 and opened.file.read(3) == b"xxx"


# -- the read tool --------------------------------------------------------------------


@pytest.mark.parametrize("name", ["notes.md", "docs/secret.txt", "hop1", "inner/up.txt"])
def test_read_tool_refuses_every_link_out(call, hostile, name):
    result = call("read", path=name)
    assert not result.ok and "outside the workspace" in result.output
    assert SECRET not in result.output


def test_read_tool_follows_a_link_inside_and_refuses_a_fifo(call, hostile, workspace):
    assert "inside text" in call("read", path="inner/alias.txt").output
    os.mkfifo(workspace / "pipe.md")
    result = finishes(lambda: call("read", path="pipe.md"))
    assert not result.ok and "not a regular file" in result.output


def test_read_tool_refuses_a_link_swapped_in_after_resolution(
    call, workspace, outside, monkeypatch
):
    """resolve_path saw a plain file; by the time it is opened it is a link out."""
    import tools.files.read

    (workspace / "late.txt").write_text("harmless\n")
    real_resolve = tools.files.read.resolve_path

    def resolve_then_swap(raw, roots):
        resolved = real_resolve(raw, roots)
        (workspace / "late.txt").unlink()
        (workspace / "late.txt").symlink_to(outside / "secret.txt")
        return resolved

    monkeypatch.setattr(tools.files.read, "resolve_path", resolve_then_swap)
    result = call("read", path="late.txt")
    assert not result.ok and SECRET not in result.output


# -- the Python grep engine -----------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "git"])
def test_python_grep_never_reads_through_a_link_out(hostile, outside, kind):
    if kind == "git":
        init_repo(hostile)
        commit_all(hostile)  # the links themselves are tracked
    result = grep(hostile, pattern="(?=SECRET)SECRET|inside")  # look-ahead: never ripgrep
    assert result.ok and result.data["engine"] == "python"
    assert SECRET not in result.output
    assert "real.txt:1:inside text" in result.output
    assert "alias.txt" not in result.output  # its target is searched under its own name
    # notes.md, docs, hop1, hop2 and inner/up.txt all lead out
    assert result.data["skipped_outside_links"] == 5
    assert "Skipped 5 file(s) whose symbolic link leads outside the workspace" in result.output


def test_python_grep_skips_index_entries_below_a_directory_now_a_link(workspace, outside):
    """The audit's case: `docs/secret.txt` is tracked, then `docs` becomes a link out."""
    init_repo(workspace)
    (workspace / "docs").mkdir()
    (workspace / "docs" / "secret.txt").write_text("tracked\n")
    (workspace / "keep.txt").write_text("kept\n")
    commit_all(workspace)
    (workspace / "docs" / "secret.txt").unlink()
    (workspace / "docs").rmdir()
    (workspace / "docs").symlink_to(outside, target_is_directory=True)
    assert "docs/secret.txt" not in list(visible_files(workspace, workspace))
    result = grep(workspace, pattern="(?=SECRET)SECRET")
    assert SECRET not in result.output
    assert result.data["skipped_outside_links"] == 1  # `docs` itself, listed as untracked


def test_python_grep_follows_a_link_to_an_unlisted_file_inside(workspace):
    (workspace / ".gitignore").write_text("hidden/\n")
    (workspace / "hidden").mkdir()
    (workspace / "hidden" / "doc.txt").write_text("findme\n")
    (workspace / "doc.txt").symlink_to("hidden/doc.txt")
    result = grep(workspace, pattern="findme")
    assert result.output.splitlines() == ["doc.txt:1:findme"]


def test_python_grep_does_not_reach_a_secret_through_a_link(workspace):
    (workspace / ".env").write_text("API_KEY=hunter2\n")
    (workspace / "settings.txt").symlink_to(".env")
    result = grep(workspace, pattern="API_KEY")
    assert "hunter2" not in result.output and result.output.startswith("No matches")


def test_python_grep_does_not_block_on_a_fifo(workspace):
    (workspace / "a.txt").write_text("needle\n")
    os.mkfifo(workspace / "notes.md")
    result = finishes(lambda: grep(workspace, pattern="needle"))
    assert result.output.splitlines() == ["a.txt:1:needle"]


_MEASURE = """
import json, resource, sys, tracemalloc
from pathlib import Path
from tools import ToolContext, default_registry

workspace = Path(sys.argv[1])
ctx = ToolContext(workspace=workspace, use_ripgrep=False)
registry = default_registry()
registry.call("grep", {"pattern": "warm-up-no-match"}, ToolContext(workspace=workspace / "small"))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
result = registry.call("grep", {"pattern": "needle"}, ctx)
peak = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"peak": peak, "rss_growth": (after - before) * 1024, "output": result.output,
                  "long_lines": result.data["long_lines"]}))
"""


def test_python_grep_memory_stays_bounded_on_a_huge_single_line(workspace):
    """A 50 MB file without a newline must not be held whole (the audit saw +474 MB)."""
    size = 50 * 1024 * 1024
    (workspace / "small").mkdir()
    (workspace / "small" / "x.txt").write_text("x\n")
    with open(workspace / "huge.txt", "wb") as handle:
        handle.write(b"needle ")
        chunk = b"abcdefgh" * (1 << 17)  # 1 MiB
        for _ in range(size // len(chunk)):
            handle.write(chunk)
    root = Path(__file__).resolve().parents[2]
    completed = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(workspace)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=True,
    )
    measured = json.loads(completed.stdout)
    print("huge-line grep:", {k: measured[k] for k in ("peak", "rss_growth")})
    assert measured["peak"] < 20 * 1024 * 1024, measured["peak"]
    assert measured["rss_growth"] < 20 * 1024 * 1024, measured["rss_growth"]
    assert "huge.txt:1:needle" in measured["output"]
    assert measured["long_lines"] == 1 and "searched only in their first" in measured["output"]


@pytest.mark.skipif(shutil.which("rg") is None, reason="ripgrep is not installed")
def test_ripgrep_output_lines_are_cut_by_ripgrep(workspace):
    (workspace / "min.js").write_text("needle" + "x" * 200_000 + "\n")
    ctx = ToolContext(workspace=workspace, use_ripgrep=True)
    result = default_registry().call("grep", {"pattern": "needle"}, ctx)
    assert result.data["engine"] == "ripgrep"
    assert result.output.startswith("min.js:1:needle") and len(result.output) < 2000


# -- ignore files ---------------------------------------------------------------------


def test_a_gitignore_linking_out_gives_no_rules(workspace, outside):
    (outside / "rules").write_text("*.py\n")
    (workspace / "app.py").write_text("x = 1\n")
    (workspace / ".gitignore").symlink_to(outside / "rules")
    assert read_rules_file(workspace, PurePosixPath(".gitignore")) == []
    assert "app.py" in list(visible_files(workspace, workspace))


def test_a_gitignore_fifo_does_not_block_the_walk(workspace):
    (workspace / "app.py").write_text("x = 1\n")
    os.mkfifo(workspace / ".gitignore")
    assert "app.py" in finishes(lambda: list(visible_files(workspace, workspace)))


def test_an_oversized_ignore_file_is_read_in_whole_lines_up_to_the_cap(workspace):
    head = b"early.txt\n" + b"#" * (MAX_IGNORE_FILE_BYTES - 14) + b"\n"
    (workspace / ".gitignore").write_bytes(head + b"late.txt\n")  # straddles the cap
    patterns = [rule.source for rule in read_rules_file(workspace, PurePosixPath(".gitignore"))]
    assert patterns == ["early.txt"]  # nothing past the cap, and never half a line


def test_git_listing_ignores_a_redirecting_environment(workspace, tmp_path, monkeypatch):
    """`git ls-files` runs with the hardened environment: GIT_DIR from the caller's
    environment cannot point it at another repository."""
    init_repo(workspace)
    (workspace / "mine.txt").write_text("mine\n")
    commit_all(workspace)
    other = init_repo(tmp_path / "other")
    (other / "theirs.txt").write_text("theirs\n")
    commit_all(other)
    monkeypatch.setenv("GIT_DIR", str(other / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(other))
    assert list(visible_files(workspace, workspace)) == ["mine.txt"]
