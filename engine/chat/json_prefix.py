"""Checking, as it arrives, that text is the start of one JSON object.

Tool-call arguments written as JSON (Kimi, Hermes) are streamed to the client
while the model writes them. Sending a character only once it is known to
keep the text a valid prefix of a JSON object means a client never receives
argument text that could not belong to valid JSON, and a malformed call stops
growing at its first wrong character instead of streaming garbage to its end.

The grammar is RFC 8259, as strict as `json.loads` with NaN and Infinity
refused: no raw control characters in strings, no leading zeros, no trailing
commas, and only a single top-level object.
"""

from __future__ import annotations

import re
from enum import Enum, auto

_WHITESPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "true", "f": "false", "n": "null"}
# A run of string characters that need no attention; long file bodies inside
# arguments are skipped with one regex match instead of a Python step per char.
_PLAIN_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]+')


class _Expect(Enum):
    TOP = auto()  # whitespace, then the opening brace of the object
    VALUE = auto()
    KEY_OR_CLOSE = auto()  # just after `{`
    KEY = auto()  # after `,` inside an object
    COLON = auto()
    VALUE_OR_CLOSE = auto()  # just after `[`
    AFTER_VALUE = auto()  # `,` or the container's closing bracket
    STRING = auto()
    ESCAPE = auto()
    UNICODE = auto()
    NUMBER = auto()
    LITERAL = auto()
    DONE = auto()  # the object is complete: only whitespace may follow


class _Number(Enum):
    SIGN = auto()  # after `-`
    ZERO = auto()  # a leading 0: no more integer digits
    INTEGER = auto()
    POINT = auto()  # after `.`
    FRACTION = auto()
    EXPONENT = auto()  # after `e`
    EXPONENT_SIGN = auto()
    EXPONENT_DIGITS = auto()


_NUMBER_CAN_END = frozenset(
    {_Number.ZERO, _Number.INTEGER, _Number.FRACTION, _Number.EXPONENT_DIGITS}
)


class JsonObjectPrefix:
    """Feed text in pieces; `feed` says how much of each piece keeps the text valid.

    After the first character that cannot continue a JSON object, `failed` is
    set and every later piece is refused whole. `complete` is set once the
    object has closed; from then on only whitespace is accepted, and anything
    else is refused (with all that follows) without setting `failed`.
    """

    def __init__(self) -> None:
        self.failed = False
        self._refused = False  # something was refused: nothing more is accepted
        self._expect = _Expect.TOP
        self._stack: list[str] = []  # open containers, "{" or "["
        self._string_is_key = False
        self._unicode_left = 0
        self._number = _Number.SIGN
        self._literal_left = ""

    @property
    def complete(self) -> bool:
        return self._expect is _Expect.DONE and not self.failed

    @property
    def in_string(self) -> bool:
        """Inside a string, where any text (marker-like tags included) is just characters."""
        return self._expect in (_Expect.STRING, _Expect.ESCAPE, _Expect.UNICODE)

    def feed(self, text: str) -> int:
        """Consume text; return the length of its longest prefix that keeps the whole valid."""
        if self._refused:
            return 0
        position = 0
        while position < len(text):
            if self._expect is _Expect.STRING:
                run = _PLAIN_STRING_RUN.match(text, position)
                if run is not None:
                    position = run.end()
                    continue
            if not self._step(text[position]):
                # After a complete object the text goes on with something else,
                # which is the caller's to judge; before that, it is broken JSON.
                self.failed = self._expect is not _Expect.DONE
                self._refused = True
                return position
            position += 1
        return position

    # -- one character -------------------------------------------------------

    def _step(self, char: str) -> bool:
        expect = self._expect
        if expect is _Expect.STRING:
            return self._in_string(char)
        if expect is _Expect.ESCAPE:
            return self._in_escape(char)
        if expect is _Expect.UNICODE:
            if char not in _HEX:
                return False
            self._unicode_left -= 1
            if self._unicode_left == 0:
                self._expect = _Expect.STRING
            return True
        if expect is _Expect.LITERAL:
            if char != self._literal_left[0]:
                return False
            self._literal_left = self._literal_left[1:]
            if not self._literal_left:
                self._end_value()
            return True
        if expect is _Expect.NUMBER:
            if self._in_number(char):
                return True
            if self._number not in _NUMBER_CAN_END:
                return False
            self._end_value()  # the character ends the number; read it as what follows
            return self._step(char)
        if char in _WHITESPACE:
            return True
        return self._structural(char)

    def _structural(self, char: str) -> bool:
        expect = self._expect
        if expect is _Expect.TOP:
            return self._open("{") if char == "{" else False
        if expect is _Expect.DONE:
            return False
        if expect in (_Expect.KEY_OR_CLOSE, _Expect.KEY):
            if char == '"':
                self._string_is_key = True
                self._expect = _Expect.STRING
                return True
            return expect is _Expect.KEY_OR_CLOSE and char == "}" and self._close("{")
        if expect is _Expect.COLON:
            if char != ":":
                return False
            self._expect = _Expect.VALUE
            return True
        if expect is _Expect.AFTER_VALUE:
            return self._after_value(char)
        if expect is _Expect.VALUE_OR_CLOSE and char == "]":
            return self._close("[")
        return self._start_value(char)

    def _start_value(self, char: str) -> bool:
        if char in "{[":
            return self._open(char)
        if char == '"':
            self._string_is_key = False
            self._expect = _Expect.STRING
            return True
        if char == "-" or char in _DIGITS:
            self._number = _Number.SIGN if char == "-" else _number_start(char)
            self._expect = _Expect.NUMBER
            return True
        if char in _LITERALS:
            self._literal_left = _LITERALS[char][1:]
            self._expect = _Expect.LITERAL
            return True
        return False

    def _after_value(self, char: str) -> bool:
        container = self._stack[-1]
        if char == ",":
            self._expect = _Expect.KEY if container == "{" else _Expect.VALUE
            return True
        if (char == "}" and container == "{") or (char == "]" and container == "["):
            return self._close(container)
        return False

    def _open(self, bracket: str) -> bool:
        self._stack.append(bracket)
        self._expect = _Expect.KEY_OR_CLOSE if bracket == "{" else _Expect.VALUE_OR_CLOSE
        return True

    def _close(self, bracket: str) -> bool:
        if not self._stack or self._stack[-1] != bracket:
            return False
        self._stack.pop()
        self._end_value()
        return True

    def _end_value(self) -> None:
        self._expect = _Expect.AFTER_VALUE if self._stack else _Expect.DONE

    def _in_string(self, char: str) -> bool:
        if char == '"':
            if self._string_is_key:
                self._expect = _Expect.COLON
            else:
                self._end_value()
            return True
        if char == "\\":
            self._expect = _Expect.ESCAPE
            return True
        return char >= " "  # raw control characters are not allowed in JSON strings

    def _in_escape(self, char: str) -> bool:
        if char == "u":
            self._unicode_left = 4
            self._expect = _Expect.UNICODE
            return True
        if char in _SIMPLE_ESCAPES:
            self._expect = _Expect.STRING
            return True
        return False

    def _in_number(self, char: str) -> bool:
        state = self._number
        if char in _DIGITS:
            if state is _Number.SIGN:
                self._number = _number_start(char)
            elif state is _Number.ZERO:
                return False
            elif state is _Number.POINT:
                self._number = _Number.FRACTION
            elif state in (_Number.EXPONENT, _Number.EXPONENT_SIGN):
                self._number = _Number.EXPONENT_DIGITS
            return True
        if char == "." and state in (_Number.ZERO, _Number.INTEGER):
            self._number = _Number.POINT
            return True
        if char in "eE" and state in (_Number.ZERO, _Number.INTEGER, _Number.FRACTION):
            self._number = _Number.EXPONENT
            return True
        if char in "+-" and state is _Number.EXPONENT:
            self._number = _Number.EXPONENT_SIGN
            return True
        return False


def _number_start(digit: str) -> _Number:
    return _Number.ZERO if digit == "0" else _Number.INTEGER
