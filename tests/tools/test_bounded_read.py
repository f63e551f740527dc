"""read_bounded: regular files only, through links only to regular files, never past a cap."""

from __future__ import annotations

import os
import socket

import pytest

from tests.hostile_files import OVERSIZE_BYTES, finishes, make_hostile
from tools.workspace.bounded_read import (
    FileTooLarge,
    NotARegularFile,
    RefusedFile,
    read_bounded,
    read_bounded_text,
)


def test_a_regular_file_and_a_link_to_one_are_read(tmp_path):
    (tmp_path / "a.json").write_bytes(b'{"x": 1}')
    (tmp_path / "link.json").symlink_to(tmp_path / "a.json")
    assert read_bounded(tmp_path / "a.json", 100) == b'{"x": 1}'
    assert read_bounded(tmp_path / "link.json", 100) == b'{"x": 1}'
    assert read_bounded(tmp_path / "a.json", 8) == b'{"x": 1}'  # exactly the cap is fine


def test_a_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "absent", 100)
    (tmp_path / "dangling").symlink_to(tmp_path / "absent")
    with pytest.raises(FileNotFoundError):
        read_bounded(tmp_path / "dangling", 100)


def test_a_link_to_dev_zero_is_refused_and_says_where_it_leads(tmp_path):
    path = tmp_path / "hooks.json"
    make_hostile(path, "dev_zero")
    with pytest.raises(NotARegularFile) as caught:
        finishes(lambda: read_bounded(path, 1024))
    assert caught.value.reason == (
        "is a character device, not a regular file (it is a symbolic link to /dev/zero)"
    )
    assert str(caught.value) == f"{path} {caught.value.reason}"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    path = tmp_path / "mcp.json"
    make_hostile(path, "fifo")
    with pytest.raises(NotARegularFile, match=r"is a FIFO \(named pipe\), not a regular file"):
        finishes(lambda: read_bounded(path, 1024), fifo=path)


def test_a_directory_and_a_socket_are_refused(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(NotARegularFile, match="is a directory"):
        read_bounded(tmp_path / "folder", 1024)
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(tmp_path / "sock"))
        with pytest.raises(NotARegularFile, match="is a socket"):
            read_bounded(tmp_path / "sock", 1024)
    finally:
        server.close()


def test_an_oversize_file_is_refused_unread_or_cut_when_asked(tmp_path):
    path = tmp_path / "big.json"
    make_hostile(path, "oversize")
    with pytest.raises(FileTooLarge) as caught:
        finishes(lambda: read_bounded(path, 1024))
    assert caught.value.reason == f"is {OVERSIZE_BYTES:,} bytes; it may have at most 1,024"
    head = read_bounded(path, 16, truncate=True)
    assert head == b'{"hooks": {}, "m'


def test_a_regular_file_without_a_size_is_still_bounded():
    """/proc files say 0 bytes and hold more: the cap is on what is read, not on st_size."""
    with pytest.raises(FileTooLarge, match="holds more than 10 bytes"):
        read_bounded("/proc/self/status", 10)
    assert len(read_bounded("/proc/self/status", 10, truncate=True)) == 10


def test_refusals_are_oserrors_so_existing_handlers_report_them(tmp_path):
    make_hostile(tmp_path / "zero", "dev_zero")
    with pytest.raises(OSError):
        read_bounded(tmp_path / "zero", 10)
    assert issubclass(FileTooLarge, RefusedFile) and issubclass(RefusedFile, OSError)


def test_text_is_utf8_with_a_byte_order_mark_dropped(tmp_path):
    (tmp_path / "t").write_bytes(b"\xef\xbb\xbfh\xc3\xa9")
    assert read_bounded_text(tmp_path / "t", 100) == "hé"
    (tmp_path / "bad").write_bytes(b"\xff")
    with pytest.raises(UnicodeDecodeError):
        read_bounded_text(tmp_path / "bad", 100)


def test_a_device_is_never_opened(tmp_path, monkeypatch):
    """The kind is judged by stat before any open: opening some devices acts."""
    make_hostile(tmp_path / "tty", "dev_zero")
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda *a, **k: opened.append(a) or real_open(*a, **k))
    with pytest.raises(NotARegularFile):
        read_bounded(tmp_path / "tty", 10)
    assert opened == []
