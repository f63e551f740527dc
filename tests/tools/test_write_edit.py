"""write and edit: atomic, mode-keeping, refusing stale targets, exact matches, CRLF kept."""

from __future__ import annotations

import os
import stat
import threading

import pytest

import tools.workspace.safe_fs
from tools.workspace.safe_fs import TEMP_SUFFIX


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- write ---------------------------------------------------------------------


def test_write_creates_parents_and_the_exact_content(call, workspace):
    result = call("write", path="a/b/c.txt", content="hello\nworld")
    assert result.ok and result.data["created"] is True
    assert (workspace / "a/b/c.txt").read_bytes() == b"hello\nworld"
    umask = os.umask(0)
    os.umask(umask)
    assert _mode(workspace / "a/b/c.txt") == 0o666 & ~umask


def test_write_refuses_an_existing_file_never_read(call, workspace):
    (workspace / "a.txt").write_text("original\n")
    result = call("write", path="a.txt", content="clobbered\n")
    assert not result.ok and "has not been read" in result.output
    assert (workspace / "a.txt").read_text() == "original\n"


def test_write_keeps_the_mode_of_an_existing_file(call, workspace):
    script = workspace / "run.sh"
    script.write_text("#!/bin/sh\necho old\n")
    script.chmod(0o751)
    call("read", path="run.sh")
    result = call("write", path="run.sh", content="#!/bin/sh\necho new\n")
    assert result.ok and "-echo old" in result.data["diff"]
    assert _mode(script) == 0o751
    assert script.read_text() == "#!/bin/sh\necho new\n"


def test_write_refuses_a_file_changed_underneath(call, workspace):
    target = workspace / "a.txt"
    target.write_text("v1\n")
    call("read", path="a.txt")
    target.write_text("v2 by someone else\n")
    result = call("write", path="a.txt", content="v3\n")
    assert not result.ok
    assert "changed since you last read it" in result.output and "Read it again" in result.output
    assert target.read_text() == "v2 by someone else\n"


def test_write_keeps_crlf_of_an_existing_file(call, workspace):
    (workspace / "dos.txt").write_bytes(b"a\r\nb\r\n")
    call("read", path="dos.txt")
    assert call("write", path="dos.txt", content="x\ny\n").ok
    assert (workspace / "dos.txt").read_bytes() == b"x\r\ny\r\n"


@pytest.mark.parametrize("failing", ["replace", "write"])
def test_failed_write_leaves_the_original_and_no_temp_file(call, workspace, monkeypatch, failing):
    target = workspace / "a.txt"
    target.write_text("original\n")
    call("read", path="a.txt")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tools.workspace.safe_fs.os, failing, boom)
    result = call("write", path="a.txt", content="new content\n")
    monkeypatch.undo()
    assert not result.ok and "No space left" in result.output
    assert target.read_text() == "original\n"
    assert [p.name for p in workspace.iterdir()] == ["a.txt"]
    assert not any(p.name.endswith(TEMP_SUFFIX) for p in workspace.rglob("*"))


def test_write_into_a_directory_path_fails_cleanly(call, workspace):
    (workspace / "dir").mkdir()
    result = call("write", path="dir", content="x")
    assert not result.ok


# -- edit ----------------------------------------------------------------------


def test_edit_replaces_exactly_once_and_returns_a_diff(call, workspace):
    (workspace / "m.py").write_text("def f():\n    return 1\n")
    call("read", path="m.py")
    result = call("edit", path="m.py", old_string="return 1", new_string="return 2")
    assert result.ok and result.data["replacements"] == 1
    assert "-    return 1" in result.data["diff"] and "+    return 2" in result.data["diff"]
    assert (workspace / "m.py").read_text() == "def f():\n    return 2\n"


def test_edit_of_a_file_never_read_is_refused(call, workspace):
    (workspace / "m.py").write_text("x = 1\n")
    result = call("edit", path="m.py", old_string="x = 1", new_string="x = 2")
    assert not result.ok and "has not been read" in result.output


def test_edit_with_no_match_returns_the_closest_lines(call, workspace):
    lines = [f"value_{i} = {i}" for i in range(40)]
    lines[25] = "    total = compute_total(items, tax_rate)"
    (workspace / "m.py").write_text("\n".join(lines) + "\n")
    call("read", path="m.py")
    result = call(
        "edit", path="m.py", old_string="total = compute_totals(items, tax)", new_string="x"
    )
    assert not result.ok
    assert "not found" in result.output
    assert "lines 26-26" in result.output and "compute_total(items, tax_rate)" in result.output
    assert (workspace / "m.py").read_text().count("compute_total") == 1


def test_edit_with_only_whitespace_differences_says_so(call, workspace):
    (workspace / "m.py").write_text("if x:\n\treturn 1\n")
    call("read", path="m.py")
    result = call("edit", path="m.py", old_string="if x:\n    return 1", new_string="pass")
    assert not result.ok and "whitespace" in result.output


def test_edit_with_two_matches_is_refused_unless_replace_all(call, workspace):
    (workspace / "m.py").write_text("a = 1\nb = 2\na = 1\n")
    call("read", path="m.py")
    result = call("edit", path="m.py", old_string="a = 1", new_string="a = 3")
    assert not result.ok
    assert "appears 2 times" in result.output and "lines 1, 3" in result.output
    assert (workspace / "m.py").read_text() == "a = 1\nb = 2\na = 1\n"
    result = call("edit", path="m.py", old_string="a = 1", new_string="a = 3", replace_all=True)
    assert result.ok and result.data["replacements"] == 2
    assert (workspace / "m.py").read_text() == "a = 3\nb = 2\na = 3\n"


def test_edit_refuses_a_file_changed_between_read_and_edit(call, workspace):
    target = workspace / "m.py"
    target.write_text("x = 1\n")
    call("read", path="m.py")
    target.write_text("x = 1\ny = 2\n")  # someone else's change
    result = call("edit", path="m.py", old_string="x = 1", new_string="x = 5")
    assert not result.ok and "changed since you last read it" in result.output
    assert target.read_text() == "x = 1\ny = 2\n"
    call("read", path="m.py")
    assert call("edit", path="m.py", old_string="x = 1", new_string="x = 5").ok
    assert target.read_text() == "x = 5\ny = 2\n"


def test_same_size_change_within_the_same_mtime_is_still_caught(call, workspace):
    target = workspace / "m.py"
    target.write_text("x = 1\n")
    call("read", path="m.py")
    before = os.stat(target)
    target.write_text("x = 9\n")
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    result = call("edit", path="m.py", old_string="x = 9", new_string="x = 2")
    assert not result.ok and "changed since" in result.output


def test_a_touch_without_change_does_not_count_as_a_change(call, workspace):
    target = workspace / "m.py"
    target.write_text("x = 1\n")
    call("read", path="m.py")
    os.utime(target, (1, 1))
    assert call("edit", path="m.py", old_string="x = 1", new_string="x = 2").ok


def test_successive_edits_need_no_reread(call, workspace):
    (workspace / "m.py").write_text("a\nb\n")
    call("read", path="m.py")
    assert call("edit", path="m.py", old_string="a", new_string="A").ok
    assert call("edit", path="m.py", old_string="b", new_string="B").ok
    assert (workspace / "m.py").read_text() == "A\nB\n"


def test_crlf_round_trip(call, workspace):
    (workspace / "dos.txt").write_bytes(b"first\r\nsecond\r\nthird\r\n")
    call("read", path="dos.txt")
    result = call("edit", path="dos.txt", old_string="first\nsecond", new_string="one\ntwo\nmore")
    assert result.ok
    assert (workspace / "dos.txt").read_bytes() == b"one\r\ntwo\r\nmore\r\nthird\r\n"


def test_lf_files_stay_lf(call, workspace):
    (workspace / "unix.txt").write_bytes(b"a\nb\n")
    call("read", path="unix.txt")
    call("edit", path="unix.txt", old_string="a\nb", new_string="c\nd")
    assert (workspace / "unix.txt").read_bytes() == b"c\nd\n"


def test_edit_keeps_bytes_that_are_not_utf8(call, workspace):
    (workspace / "latin.txt").write_bytes(b"caf\xe9\nhello\n")
    call("read", path="latin.txt")
    assert call("edit", path="latin.txt", old_string="hello", new_string="bye").ok
    assert (workspace / "latin.txt").read_bytes() == b"caf\xe9\nbye\n"


def test_edit_refuses_binary_files_and_identical_strings(call, workspace):
    (workspace / "b.bin").write_bytes(b"abc\x00def")
    call("read", path="b.bin")
    assert "binary" in call("edit", path="b.bin", old_string="abc", new_string="x").output
    (workspace / "t.txt").write_text("same\n")
    call("read", path="t.txt")
    assert not call("edit", path="t.txt", old_string="same", new_string="same").ok


def test_edit_keeps_mode(call, workspace):
    script = workspace / "run.sh"
    script.write_text("echo a\n")
    script.chmod(0o700)
    call("read", path="run.sh")
    call("edit", path="run.sh", old_string="echo a", new_string="echo b")
    assert _mode(script) == 0o700


def test_two_racing_editors_lose_no_update(registry, ctx, workspace):
    tokens = [f"tok{i:02d}" for i in range(40)]
    (workspace / "shared.txt").write_text("\n".join(tokens) + "\n")
    assert registry.call("read", {"path": "shared.txt"}, ctx).ok
    start = threading.Barrier(2)
    results = []

    def editor(mine):
        start.wait()
        for token in mine:
            arguments = {"path": "shared.txt", "old_string": token, "new_string": token.upper()}
            results.append(registry.call("edit", arguments, ctx))

    threads = [threading.Thread(target=editor, args=(tokens[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.ok for r in results), [r.output for r in results if not r.ok]
    assert (workspace / "shared.txt").read_text() == "\n".join(t.upper() for t in tokens) + "\n"
