"""read, write and edit through an attached editor (tools.files.access), the disk untouched
where the editor answers and still guarded where it does not."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import ToolContext, ToolLimits, default_registry


class FakeEditor:
    """An editor with unsaved buffers: reads come from them, writes go to them."""

    def __init__(self, buffers: dict[str, str] | None = None, *, writes: bool = True) -> None:
        self.buffers = dict(buffers or {})
        self.writes = writes
        self.read_paths: list[Path] = []
        self.written: list[tuple[Path, str]] = []
        self.fail_writes = False

    def read_text(self, path: Path) -> str | None:
        self.read_paths.append(path)
        return self.buffers.get(path.name)

    def write_text(self, path: Path, content: str) -> bool:
        if not self.writes:
            return False
        if self.fail_writes:
            raise OSError("the editor refused")
        self.written.append((path, content))
        self.buffers[path.name] = content
        return True


@pytest.fixture
def editor() -> FakeEditor:
    return FakeEditor()


@pytest.fixture
def ctx(workspace, editor) -> ToolContext:
    return ToolContext(workspace=workspace, limits=ToolLimits(), file_access=editor)


@pytest.fixture
def call(ctx):
    registry = default_registry()
    return lambda name, **arguments: registry.call(name, arguments, ctx)


def test_read_shows_the_unsaved_buffer(call, workspace, editor):
    (workspace / "a.py").write_text("x = 1\n")
    editor.buffers["a.py"] = "x = 2  # unsaved\n"
    result = call("read", path="a.py")
    assert result.ok and "x = 2  # unsaved" in result.output
    assert editor.read_paths == [workspace / "a.py"]  # absolute and resolved


def test_edit_works_on_the_buffer_and_writes_through_the_editor(call, workspace, editor):
    (workspace / "a.py").write_text("x = 1\n")
    editor.buffers["a.py"] = "x = 2\n"
    assert call("read", path="a.py").ok
    result = call("edit", path="a.py", old_string="x = 2", new_string="x = 3")
    assert result.ok, result.output
    assert editor.written == [(workspace / "a.py", "x = 3\n")]
    assert (workspace / "a.py").read_text() == "x = 1\n"  # the editor saves, not the tool
    again = call("edit", path="a.py", old_string="x = 3", new_string="x = 4")
    assert again.ok, again.output  # the stamp is of what the editor holds now


def test_edit_refuses_when_the_buffer_changed_since_the_read(call, workspace, editor):
    (workspace / "a.py").write_text("x = 1\n")
    assert call("read", path="a.py").ok  # no buffer: the disk
    editor.buffers["a.py"] = "x = 1\ny = 2\n"  # the user typed since
    result = call("edit", path="a.py", old_string="x = 1", new_string="x = 5")
    assert not result.ok and "changed since you last read it" in result.output
    assert editor.written == []


def test_write_creates_a_new_file_through_the_editor(call, workspace, editor):
    result = call("write", path="pkg/new.py", content="print('hi')\n")
    assert result.ok, result.output
    assert editor.written == [(workspace / "pkg" / "new.py", "print('hi')\n")]
    assert (workspace / "pkg").is_dir()  # its folder exists for the editor to save into


def test_an_editor_that_does_not_write_leaves_it_to_the_disk(workspace):
    editor = FakeEditor(writes=False)
    ctx = ToolContext(workspace=workspace, file_access=editor)
    result = default_registry().call("write", {"path": "b.txt", "content": "hello\n"}, ctx)
    assert result.ok and (workspace / "b.txt").read_text() == "hello\n"


def test_a_failed_editor_write_is_an_error_for_the_model(call, workspace, editor):
    editor.fail_writes = True
    result = call("write", path="c.txt", content="data\n")
    assert not result.ok and "the editor refused" in result.output
    assert not (workspace / "c.txt").exists()


def test_files_that_are_not_utf8_bypass_the_editor(call, workspace, editor):
    (workspace / "latin.txt").write_bytes(b"caf\xe9 = 1\n")
    editor.buffers["latin.txt"] = "something else\n"
    assert call("read", path="latin.txt").ok
    result = call("edit", path="latin.txt", old_string="= 1", new_string="= 2")
    assert result.ok, result.output
    assert (workspace / "latin.txt").read_bytes() == b"caf\xe9 = 2\n"  # bytes kept, on disk
    assert editor.read_paths == [] and editor.written == []


def test_paths_outside_the_workspace_never_reach_the_editor(call, outside, editor):
    result = call("read", path=str(outside / "secret.txt"))
    assert not result.ok
    assert editor.read_paths == []
