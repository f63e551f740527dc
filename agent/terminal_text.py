"""Text bound for a terminal: control characters shown, never obeyed.

Much of what Resident prints was written by someone else: the model's
streamed text and tool calls, todo items, tool output, hook commands from a
repository's hooks.json, MCP server names and tool descriptions, custom
command descriptions, file paths. A terminal obeys what such text holds: ESC
starts a CSI sequence (`\\x1b[2K` erases the line, `\\x1b[A` moves up) or an OSC
one (`\\x1b]52;c;...` writes the clipboard, `\\x1b]8;;url` makes a link, `\\x1b]0;`
sets the title), `\\r` and backspace overwrite what is already shown, and the
C1 characters U+0080-U+009F are the same controls in one byte (U+009B is a
CSI). `resident hooks list` could then show a harmless command while another
is trusted. Bidirectional overrides and isolates (U+202A-U+202E,
U+2066-U+2069) reorder what follows them, so a line can read differently
from what it holds ("Trojan Source"); they are shown too. Lone surrogates
cannot be written as UTF-8 at all.

`terminal_safe` shows each such character as its escape (`\\x1b`, `\\r`,
`\\u202e`), so the whole sequence is visible text and nothing is interpreted.
Each character is replaced on its own, so text that arrives in pieces (a
stream split mid-sequence) is made safe piece by piece. Newlines and tabs
stay, and `\\r\\n` becomes a newline, unless `one_line`: then they are shown
too, for a value that must stay on its line (a hook command, a name). All
other Unicode (accents, CJK, emoji with their joiners) is left alone.

`picture` is the same judgment as a one-cell glyph (␛ for ESC, U+FFFD for
what has no picture), for the TUI, whose layout is measured in cells before
its line filter (agent/tui/control_filter.py) sees the text.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, bidi embeddings, overrides and
# isolates, lone surrogates.
_SHOWN = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE = re.compile(f"[{_SHOWN}]")
_UNSAFE_ONE_LINE = re.compile(f"[\t\n{_SHOWN}]")
_JSON_UNSAFE = re.compile(f"[{_SHOWN}]")  # JSON has escaped the C0 ones already
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
_PICTURE_DELETE = "\u2421"  # ␡
_NO_PICTURE = "\ufffd"


def escape(char: str) -> str:
    """One character as Python writes it in a string literal: `\\x1b`, `\\r`, `\\u202e`."""
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def terminal_safe(text: str, *, one_line: bool = False) -> str:
    """`text` with every character a terminal would obey shown as its escape.
    `one_line`: newlines and tabs are shown too (and `\\r\\n` is two escapes)."""
    if one_line:
        return _UNSAFE_ONE_LINE.sub(lambda found: escape(found.group()), text)
    if "\r\n" in text:
        text = text.replace("\r\n", "\n")
    return _UNSAFE.sub(lambda found: escape(found.group()), text)


def json_terminal_safe(serialized: str) -> str:
    """A JSON document with the characters a terminal would obey as `\\u` escapes. JSON
    already escapes C0 controls; DEL, C1 and bidi controls may appear raw, and only
    inside strings, where the escape reads back as the same character."""
    return _JSON_UNSAFE.sub(lambda found: f"\\u{ord(found.group()):04x}", serialized)


def needs_care(text: str) -> bool:
    """Whether `text` holds anything terminal_safe or picture would change (newlines and
    tabs aside)."""
    return _UNSAFE.search(text) is not None


def picture(char: str) -> str:
    """One character a terminal would obey, as one visible cell: ␛ for ESC (the Unicode
    control pictures for C0 and DEL), U+FFFD for the rest."""
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)
    if code == 0x7F:
        return _PICTURE_DELETE
    return _NO_PICTURE


def pictured(text: str) -> str:
    """`text` with each character terminal_safe would escape (and newlines and tabs) as
    its one-cell picture."""
    return _UNSAFE_ONE_LINE.sub(lambda found: picture(found.group()), text)
