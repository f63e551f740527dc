"""The read tool: windows of numbered lines, caps, binary and non-UTF-8 files."""

from __future__ import annotations

import os

import pytest

from tools import ToolContext, ToolLimits, default_registry


def test_numbered_lines_and_windows(call, workspace):
    (workspace / "a.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = call("read", path="a.txt")
    assert result.ok and not result.truncated
    assert result.output.splitlines()[0] == "     1\tline 1"
    assert result.data["total_lines"] == 10
    window = call("read", path="a.txt", offset=4, limit=2)
    assert window.output.splitlines()[:2] == ["     4\tline 4", "     5\tline 5"]
    assert "Use offset=6" in window.output
    assert not window.truncated  # the model asked for two lines: nothing was cut


def test_offset_past_the_end_is_an_error(call, workspace):
    (workspace / "a.txt").write_text("one\n")
    result = call("read", path="a.txt", offset=5)
    assert not result.ok and "past the end" in result.output


def test_line_cap_truncates_and_says_how_to_continue(workspace):
    ctx = ToolContext(workspace=workspace, limits=ToolLimits(read_max_lines=50))
    (workspace / "big.txt").write_text("".join(f"{i}\n" for i in range(1000)))
    result = default_registry().call("read", {"path": "big.txt"}, ctx)
    assert result.truncated
    assert result.data["last_line"] == 50
    assert "Showing lines 1-50 of 1000" in result.output and "offset=51" in result.output


def test_huge_file_is_streamed_with_output_capped(workspace):
    ctx = ToolContext(workspace=workspace, limits=ToolLimits(read_max_output_chars=20_000))
    line = "x" * 99 + "\n"
    with open(workspace / "huge.txt", "w") as handle:
        for _ in range(200):
            handle.write(line * 1000)  # 20 MB, 200,000 lines
    result = default_registry().call("read", {"path": "huge.txt"}, ctx)
    assert result.ok and result.truncated
    assert len(result.output) < 25_000
    assert result.data["total_lines"] == 200_000
    assert result.data["size"] == 20_000_000


def test_a_giant_single_line_is_cut(call, workspace):
    (workspace / "minified.js").write_bytes(b"a" * 3_000_000)
    result = call("read", path="minified.js")
    assert result.ok
    assert "line truncated; 3,000,000 bytes" in result.output
    assert len(result.output) < 5000


def test_binary_files_are_described_not_dumped(call, workspace):
    (workspace / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    result = call("read", path="img.png")
    assert result.ok
    assert result.data["binary"] is True
    assert "PNG image" in result.output and "IHDR" not in result.output


def test_non_utf8_is_decoded_with_replacement_and_flagged(call, workspace):
    (workspace / "latin1.txt").write_bytes("café\nnaïve\n".encode("latin-1"))
    result = call("read", path="latin1.txt")
    assert result.ok
    assert result.data["decode_errors"] is True
    assert "caf\ufffd" in result.output
    assert "not valid UTF-8" in result.output


def test_crlf_files_are_flagged_and_shown_without_carriage_returns(call, workspace):
    (workspace / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    result = call("read", path="dos.txt")
    assert result.data["crlf"] is True
    assert "\r" not in result.output
    assert "     2\ttwo" in result.output


def test_empty_missing_directory_and_fifo(call, workspace):
    (workspace / "empty.txt").write_text("")
    assert "empty" in call("read", path="empty.txt").output
    missing = call("read", path="nope.txt")
    assert not missing.ok and "does not exist" in missing.output
    (workspace / "dir").mkdir()
    assert "directory" in call("read", path="dir").output
    os.mkfifo(workspace / "pipe")
    fifo = call("read", path="pipe")  # must not block waiting for a writer
    assert not fifo.ok and "not a regular file" in fifo.output


def test_reading_records_a_stamp(call, ctx, workspace):
    (workspace / "a.txt").write_text("hello\n")
    call("read", path="a.txt", offset=1, limit=1)
    stamp = ctx.file_states.get(workspace / "a.txt")
    assert stamp is not None and stamp.size == 6


@pytest.mark.parametrize("content", [b"no newline at end", b"\n\n\n"])
def test_line_counts_match_wc_style_expectations(call, workspace, content):
    (workspace / "f.txt").write_bytes(content)
    result = call("read", path="f.txt")
    expected = content.count(b"\n") + (0 if content.endswith(b"\n") else 1)
    assert result.data["total_lines"] == expected
